"""Sweeps that search and prune (optuna: bertjax/sweep/search.py) and points at once
(--max_concurrent). Most points here are tests/sweep_point_stub.py, launch.py's flags without JAX
(a fraction of a second each); one test prunes real launch.py points."""

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from bertjax import sweep
from bertjax.core.errors import UserError
from bertjax.runtime import metric_writers
from bertjax.sweep import launchers, runner, search
from bertjax.tools import report

REPO = pathlib.Path(__file__).resolve().parent.parent
STUB = "tests/sweep_point_stub.py"
RUNLOCAL = "configs/quickstart.py:runlocal"
# The real points' tiny model on random batches (as tests/test_sweep.py's FAST).
TINY = {"data.synthetic": True, "model.vocab_size": 200, "model.hidden_size": 32,
        "model.intermediate_size": 64, "model.num_attention_heads": 2, "max_seq_length": 16,
        "max_predictions_per_seq": 4, "async_checkpointing": False, "tensorboard": False}


def write_sweep(path: pathlib.Path, body: dict) -> str:
  path.write_text(f"def get_sweep():\n  return {body!r}\n")
  return str(path)


def random_search(trials=12, **search_keys) -> dict:
  return {"config": RUNLOCAL, "command": STUB, "fixed": {"total_steps": 8, "eval_every": 1},
          "search": {"sampler": "random", "trials": trials, "seed": 0,
                     "space": {"learning_rate": ("log_uniform", 1e-5, 1e-1)}, **search_keys}}


@pytest.fixture
def fast_watch(monkeypatch):
  monkeypatch.setattr(runner, "WATCH_EVERY_S", 0.05)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")


# ---------------------------------------------------------------------------------------------
# A search, pruned.


@pytest.mark.slow
def test_seeded_random_search_prunes_points_early_and_names_the_best(tmp_path, fast_watch,
                                                                      capsys):
  """12 points drawn by a seeded random sampler over log-uniform learning rates, the median
  pruner reading each point's eval rows: at least one point is stopped early (SIGTERM: it saves
  and exits 75), recorded "pruned" with its checkpoint and curve kept; the best finished point is
  named with its settings; a rerun runs nothing (a pruned point is not requeued)."""
  workdir = tmp_path / "w"
  record = sweep.run_sweep(write_sweep(tmp_path / "s.py", random_search(pruner="median")),
                           workdir)
  points = record["points"]
  assert len(points) == 12 and record["finished"] + record["pruned"] == 12, record
  pruned = [p for p in points if p["status"] == "pruned"]
  assert pruned, [p["status"] for p in points]
  for p in pruned:
    point_dir = workdir / p["name"]
    steps = [r["step"] for r in metric_writers.read_metrics(point_dir)]
    assert steps and steps == list(range(1, len(steps) + 1)) and len(steps) < 8, steps
    assert p["returncode"] == 75 and p["last_line"].startswith("preempted: SIGTERM")
    assert [d.name for d in (point_dir / "checkpoints").iterdir()]
    assert json.loads((point_dir / "summary.json").read_text())["status"] == "preempted"
  finished = [p for p in points if p["status"] == "finished"]
  best = min(finished, key=lambda p: p["value"])
  assert record["best"]["name"] == best["name"]
  assert record["best"]["settings"] == best["overrides"] == {
      "learning_rate": pytest.approx(float(best["name"].split("=")[1]))}
  assert record["best"]["loss"] == best["value"] == min(
      r["loss"] for r in metric_writers.read_metrics(workdir / best["name"]))
  out = capsys.readouterr().out
  assert f"best point: {best['name']} (loss {best['value']:.6g})" in out
  assert record["points"] == json.loads((workdir / "sweep.json").read_text())["points"]
  # The report draws the search: value per trial and against the learning rate, and the curves,
  # the pruned ones ending where they were stopped.
  report.write_report(workdir)
  drawn = json.loads((workdir / "search.json").read_text())
  assert (workdir / "search.png").stat().st_size > 0
  assert [(d["name"], d["status"]) for d in drawn["trials"]] == [
      (p["name"], p["status"]) for p in points]
  assert [d["title"] for d in drawn["panels"]] == [
      "loss per trial", "loss against learning_rate", "dev loss curves (red: pruned)"]
  curves = {c["name"]: c for c in drawn["curves"]}
  for p in pruned:
    assert curves[p["name"]]["status"] == "pruned"
    assert curves[p["name"]]["steps"] == [r["step"] for r in metric_writers.read_metrics(
        workdir / p["name"])]
  mtimes = {p["name"]: (workdir / p["name"] / "log.txt").stat().st_mtime_ns for p in points}
  again = sweep.run_sweep(write_sweep(tmp_path / "s.py", random_search(pruner="median")),
                          workdir)
  assert "12 points in" in capsys.readouterr().out
  assert [(p["name"], p["status"]) for p in again["points"]] == [
      (p["name"], p["status"]) for p in points]
  assert {p["name"]: (workdir / p["name"] / "log.txt").stat().st_mtime_ns
          for p in points} == mtimes  # nothing launched again
  assert again["best"] == record["best"]


@pytest.mark.slow
def test_successive_halving_prunes_too(tmp_path, fast_watch):
  record = sweep.run_sweep(write_sweep(tmp_path / "s.py", random_search(
      trials=6, pruner={"kind": "successive_halving", "min_resource": 1,
                        "reduction_factor": 2})), tmp_path / "w")
  assert record["pruned"] >= 1 and record["finished"] + record["pruned"] == 6, record


@pytest.mark.slow
def test_an_interrupted_search_goes_on_in_its_own_trials(tmp_path):
  """SIGTERM to the sweep while its second point runs: the point saves and the sweep stops; the
  same command again runs that point again in the trial it had (same name, a second launch),
  then draws the third: 3 trials in the journal, none twice."""
  body = random_search(trials=3)
  body["fixed"]["total_steps"] = 30
  spec, workdir = write_sweep(tmp_path / "s.py", body), tmp_path / "w"
  args = [sys.executable, "launch.py", "--sweep", spec, "--workdir", str(workdir)]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  try:
    deadline = time.time() + 300
    while True:
      record = json.loads((workdir / "sweep.json").read_text()) if (
          workdir / "sweep.json").is_file() else {"points": []}
      if len(record["points"]) == 2 and (workdir / record["points"][1]["name"] /
                                         "metrics.jsonl").is_file():
        break
      assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
      time.sleep(0.05)
    proc.terminate()
    out = proc.communicate(timeout=120)[0]
  finally:
    proc.kill()
  assert "SIGTERM: the running points saved a checkpoint" in out, out
  first = json.loads((workdir / "sweep.json").read_text())["points"]
  assert [p["status"] for p in first] == ["finished", "preempted"]
  record = sweep.run_sweep(spec, workdir)
  assert [p["name"] for p in record["points"]][:2] == [p["name"] for p in first]
  assert [(p["status"], p["runs"]) for p in record["points"]] == [
      ("finished", 1), ("finished", 2), ("finished", 1)]
  trials = _trials(workdir)
  assert [(t.number, t.state.name, t.user_attrs["point"]) for t in trials] == [
      (i, "COMPLETE", p["name"]) for i, p in enumerate(record["points"])]


@pytest.mark.slow
def test_a_seeded_search_draws_the_same_points(tmp_path, fast_watch):
  """TPE with a seed, 3 trials, no pruner: two workdirs draw the same values."""
  body = random_search(trials=3, sampler="tpe")
  body["fixed"]["total_steps"] = 1
  names = [[p["name"] for p in sweep.run_sweep(write_sweep(tmp_path / "s.py", body),
                                               tmp_path / d)["points"]] for d in ("a", "b")]
  assert names[0] == names[1] and len(set(names[0])) == 3


def test_the_quickstart_search_file_dry_run(tmp_path, capsys):
  record = sweep.run_sweep("experiments/quickstart_search.py:tpe", tmp_path / "w", dry_run=True)
  out = capsys.readouterr().out.splitlines()
  assert out[:2] == [
      "sweep experiments/quickstart_search.py: 12 points drawn from a space, of "
      f"configs/quickstart.py:runlocal in {tmp_path / 'w'}",
      "search: tpe sampler, 12 points over learning_rate ~ log_uniform(0.0001, 0.01), "
      "optimizer.warmup_steps ~ int(0, 10), seed ~ choice[0, 1, 2]; metric loss (min); "
      "pruner median"]
  assert out[-1].endswith("--config.learning_rate=0.0001 --config.optimizer.warmup_steps=0 "
                          "--config.seed=0")
  assert record["search"]["pruner"] == {"kind": "median", "n_startup_trials": 5}
  assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_real_points_pruned_by_their_dev_loss(tmp_path, monkeypatch):
  """Two launch.py points of the tiny synthetic run, pruned by the median pruner after the first
  (n_startup_trials=1): the second, at learning rate 1e-6, is worse at its first evaluation and
  is stopped there by SIGTERM (the trainer saves a checkpoint and exits 75) long before its 4000
  steps, recorded "pruned"; the first is the best point."""
  monkeypatch.setattr(runner, "WATCH_EVERY_S", 0.1)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  fast = {**TINY, "eval_every": 20, "checkpoint_every": 1000, "log_every": 20}
  path = write_sweep(tmp_path / "s.py", {
      "config": RUNLOCAL, "fixed": fast,
      "points": [{"learning_rate": 1e-2, "total_steps": 40},
                 {"learning_rate": 1e-6, "total_steps": 4000}],
      "search": {"pruner": {"kind": "median", "n_startup_trials": 1}}})
  record = sweep.run_sweep(path, tmp_path / "w")
  first, second = record["points"]
  assert first["status"] == "finished" and second["status"] == "pruned", record
  assert second["returncode"] == 75
  point_dir = tmp_path / "w" / second["name"]
  summary = json.loads((point_dir / "summary.json").read_text())
  assert summary["status"].startswith("preempted") and 20 <= summary["step"] < 4000
  assert (point_dir / "checkpoints" / str(summary["step"])).is_dir()
  evals = [r for r in metric_writers.read_metrics(point_dir) if r["split"] == "eval"]
  assert evals[0]["step"] == 20 and evals[0]["loss"] > [
      r["loss"] for r in metric_writers.read_metrics(tmp_path / "w" / first["name"])
      if r["split"] == "eval" and r["step"] == 20][0]
  assert record["best"]["name"] == first["name"]
  assert record["best"]["settings"] == {"learning_rate": 1e-2, "total_steps": 40}
  trials = _trials(tmp_path / "w")
  assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED"]
  # The first point ends seconds after its evaluations, maybe between two reads: still, both are
  # the pruner's (at ee4b8fe they were not, and on an idle machine nothing was pruned).
  assert sorted(trials[0].intermediate_values) == [20, 40]


def _trials(workdir: pathlib.Path) -> list:
  optuna = pytest.importorskip("optuna")
  storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
      str(workdir / search.JOURNAL)))
  return optuna.load_study(study_name=search.STUDY, storage=storage).trials


def test_rows_read_together_are_judged_each_at_its_step(tmp_path, monkeypatch):
  """The second point writes ~50 rows between two reads, the first point has values at steps 1
  and 2 only: the pruner judges step 1 (optuna compares trials at the step last reported; judged
  at the read's last row only, the second point was never pruned)."""
  monkeypatch.setattr(runner, "WATCH_EVERY_S", 0.5)
  monkeypatch.setenv("BERTJAX_STUB_STEP_S", "0.01")
  path = write_sweep(tmp_path / "s.py", {
      "config": RUNLOCAL, "command": STUB, "fixed": {"eval_every": 1},
      "points": [{"learning_rate": 1e-3, "total_steps": 2},
                 {"learning_rate": 1e-5, "total_steps": 400}],
      "search": {"pruner": {"kind": "median", "n_startup_trials": 1}}})
  record = sweep.run_sweep(path, tmp_path / "w")
  assert [p["status"] for p in record["points"]] == ["finished", "pruned"]
  assert [t.state.name for t in _trials(tmp_path / "w")] == ["COMPLETE", "PRUNED"]


def test_rows_written_after_the_last_read_are_reported(tmp_path, monkeypatch):
  """A point that ends before the sweep reads its rows again: they are reported as it ends."""
  monkeypatch.setattr(runner, "WATCH_EVERY_S", 60.0)
  monkeypatch.setenv("BERTJAX_STUB_STEP_S", "0.01")
  body = random_search(trials=1, pruner="median")
  body["fixed"]["total_steps"] = 3
  sweep.run_sweep(write_sweep(tmp_path / "s.py", body), tmp_path / "w")
  (trial,) = _trials(tmp_path / "w")
  assert trial.state.name == "COMPLETE" and sorted(trial.intermediate_values) == [1, 2, 3]


# ---------------------------------------------------------------------------------------------
# Bad input: one line, nothing written.


@pytest.mark.parametrize("change, needle", [
    ({"space": {"learning_rate": ("uniform", 1e-3, 1e-4)}}, "has low 0.001 >= high 0.0001"),
    ({"space": {"learning_rate": ("log_uniform", 0.0, 1e-3)}}, "a log-uniform range needs low > 0"),
    ({"space": {"learning_rate": ("normal", 0, 1)}}, "kind one of uniform, log_uniform, int"),
    ({"space": {"warmup_steps": ("int", 0, 2.5)}}, "needs whole-number bounds"),
    ({"space": {"optimizer.b2": ("uniform", 0.9, 1.5)}}, "point optimizer.b2=1.5"),  # > 1
    ({"metric": "acuracy"}, "metric 'acuracy' is not one a mlm_nsp run logs at evaluation"),
    ({"pruner": "hyperband_x"}, "pruner 'hyperband_x' is not one of median, successive_halving"),
    ({"pruner": {"kind": "median", "n_startup_trial": 1}}, "pruner 'median' refuses"),
    ({"trials": 0}, "needs 'trials'"),
])
def test_bad_search_is_one_line_and_writes_nothing(tmp_path, change, needle):
  body = random_search(pruner="median")
  body["search"].update(change)
  with pytest.raises(UserError, match=re.escape(needle)) as e:
    sweep.run_sweep(write_sweep(tmp_path / "s.py", body), tmp_path / "w")
  assert "\n" not in str(e.value)
  assert not (tmp_path / "w").exists()


def test_a_point_command_must_exist_and_runs_here_only(tmp_path):
  body = random_search()
  body["command"] = "tests/no_such_script.py"
  with pytest.raises(UserError, match=re.escape("'command' 'tests/no_such_script.py' is not a "
                                                "script under")):
    sweep.run_sweep(write_sweep(tmp_path / "s.py", body), tmp_path / "w")
  with pytest.raises(UserError, match=re.escape(f"'command' {STUB} runs points here")):
    sweep.run_sweep(write_sweep(tmp_path / "s.py", random_search()), "/shared/w", dry_run=True,
                    tpu="t", zone="z")
  assert not (tmp_path / "w").exists()


def test_a_pruner_without_an_evaluation_is_refused(tmp_path):
  body = random_search(pruner="median")
  body["fixed"]["eval_every"] = 0
  with pytest.raises(UserError, match=r"pruner 'median' reads each point's dev metric, and point "
                     r"\S+ never evaluates \(eval_every=0\)"):
    sweep.run_sweep(write_sweep(tmp_path / "s.py", body), tmp_path / "w")
  assert not (tmp_path / "w").exists()


def test_a_metric_missing_from_the_rows_stops_the_sweep_in_one_line(tmp_path, fast_watch):
  """mlm_accuracy is a metric an mlm_nsp run logs, so it passes before running; the stub's rows
  hold only loss: the first row read stops the sweep, naming what the rows have."""
  body = random_search(trials=2, metric="mlm_accuracy")
  with pytest.raises(UserError, match=r"logs no 'mlm_accuracy' at evaluation \(its eval rows "
                     r"have loss\)"):
    sweep.run_sweep(write_sweep(tmp_path / "s.py", body), tmp_path / "w")
  record = json.loads((tmp_path / "w" / "sweep.json").read_text())
  assert len(record["points"]) == 1  # nothing launched after it


def test_a_journal_of_another_sweep_is_refused(tmp_path):
  optuna = pytest.importorskip("optuna")
  workdir = tmp_path / "w"
  workdir.mkdir()
  storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
      str(workdir / search.JOURNAL)))
  other = optuna.create_study(storage=storage, study_name=search.STUDY)
  spec = write_sweep(tmp_path / "s.py", random_search(pruner="median"))
  loaded = sweep.load_sweep(spec)
  mine = search.fingerprint(loaded, search.parse(loaded.search, loaded, "t"))
  other.set_user_attr("sweep", {**mine, "space": {"learning_rate": ["uniform", 0.1, 0.2]}})
  before = (workdir / search.JOURNAL).read_bytes()
  with pytest.raises(UserError, match=re.escape(
      f"{workdir / search.JOURNAL} holds the trials of another sweep (its space differ)")):
    sweep.run_sweep(spec, workdir)
  assert sorted(os.listdir(workdir)) == [search.JOURNAL]
  assert (workdir / search.JOURNAL).read_bytes() == before


def test_without_optuna_a_search_names_the_extra(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` raises ImportError
  with pytest.raises(UserError, match=re.escape('needs optuna: pip install ".[sweep]"')):
    sweep.run_sweep(write_sweep(tmp_path / "s.py", random_search()), tmp_path / "w")
  assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_a_grid_sweep_does_not_import_optuna_and_no_sweep_opens_a_device(tmp_path):
  """A grid's sweep imports no optuna; a search's, run with two points at once, schedules and
  watches without opening a device in its own process (JAX's backends never initialized)."""
  spec = write_sweep(tmp_path / "s.py", random_search(trials=2, pruner="median"))
  code = ("import sys; from bertjax import sweep; from jax._src import xla_bridge; "
          "sweep.run_sweep('experiments/quickstart_sweep.py', sys.argv[1], dry_run=True); "
          "print('optuna imported:', 'optuna' in sys.modules); "
          "r = sweep.run_sweep(sys.argv[2], sys.argv[1], max_concurrent=2); "
          "print('points done:', r['finished'] + r['pruned'], 'backends:', "
          "xla_bridge.backends_are_initialized())")
  r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "w"), spec], cwd=REPO,
                     capture_output=True, text=True, timeout=300,
                     env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, r.stdout + r.stderr
  lines = r.stdout.splitlines()
  assert "optuna imported: False" in lines and lines[-1] == "points done: 2 backends: False", lines


def test_max_concurrent_0_is_refused(tmp_path):
  with pytest.raises(UserError, match=r"^--max_concurrent 0 must be at least 1"):
    sweep.run_sweep("experiments/quickstart_sweep.py", tmp_path / "w", max_concurrent=0)
  with pytest.raises(UserError, match="not both"):
    sweep.run_sweep("experiments/quickstart_sweep.py", tmp_path / "w", max_concurrent=2,
                    local_processes=2)
  assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_max_concurrent_0_through_launch_is_one_line_exit_2(tmp_path):
  r = subprocess.run([sys.executable, "launch.py", "--sweep", "experiments/quickstart_sweep.py",
                      "--workdir", str(tmp_path / "w"), "--max_concurrent", "0"], cwd=REPO,
                     capture_output=True, text=True, timeout=300,
                     env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert r.stderr.strip().splitlines() == [
      "error: --max_concurrent 0 must be at least 1: how many points run at once"]
  assert not (tmp_path / "w").exists()


# ---------------------------------------------------------------------------------------------
# Points at once, each on its own devices.


@pytest.mark.slow
def test_four_points_two_at_a_time_each_on_its_own_cpu_cores(tmp_path, fast_watch, monkeypatch):
  """--max_concurrent 2 on this machine's CPU: each point's process is pinned to its own cores
  (read back from the process itself) with XLA_FLAGS faking that many devices; the two slices
  are disjoint, and the start and end times show two points at a time, never three."""
  monkeypatch.setenv("BERTJAX_STUB_STEP_S", "0.3")
  cores = sorted(os.sched_getaffinity(0))
  if len(cores) < 2:
    pytest.skip(f"this machine gives the tests {len(cores)} CPU core; two slices need two")
  body = {"config": RUNLOCAL, "command": STUB, "fixed": {"total_steps": 3},
          "product": {"seed": [0, 1, 2, 3]}}
  record = sweep.run_sweep(write_sweep(tmp_path / "s.py", body), tmp_path / "w",
                           max_concurrent=2)
  assert record["finished"] == 4 and record["mode"] == "local, 2 at once"
  envs = [json.loads((tmp_path / "w" / p["name"] / "env.json").read_text())
          for p in record["points"]]
  per = len(cores) // 2
  slices = {tuple(e["cores"]) for e in envs}
  assert slices == {tuple(cores[:per]), tuple(cores[per:2 * per])}
  for e in envs:
    assert e["environ"]["BERTJAX_CPU_CORES"] == ",".join(map(str, e["cores"]))
    assert f"--xla_force_host_platform_device_count={per}" in e["environ"]["XLA_FLAGS"]
  spans = [(e["started"], e["ended"]) for e in envs]
  at = lambda t: sum(s <= t < end for s, end in spans)
  assert max(at(s) for s, _ in spans) == 2, spans
  assert spans[1][0] < spans[0][1] and spans[0][0] < spans[1][1]  # the first two together
  assert min(spans[2][0], spans[3][0]) >= min(spans[0][1], spans[1][1]) - 0.05  # then a slot frees
  # Two running on distinct slices at once: the overlapping points' cores differ.
  for i, (s, _) in enumerate(spans):
    for j, (s2, e2) in enumerate(spans):
      if i != j and s2 <= s < e2:
        assert set(envs[i]["cores"]).isdisjoint(envs[j]["cores"])


@pytest.mark.slow
def test_two_real_points_at_once(tmp_path, monkeypatch):
  """Two launch.py points of the tiny synthetic run with --max_concurrent 2, each on its slice
  of the CPU (its cores, one faked device per core): both finish, their runs overlap in time."""
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  if len(os.sched_getaffinity(0)) < 2:
    pytest.skip("two CPU slices need two cores")
  fast = {**TINY, "total_steps": 4, "eval_every": 2, "checkpoint_every": 4, "log_every": 2}
  record = sweep.run_sweep(write_sweep(tmp_path / "s.py", {
      "config": RUNLOCAL, "fixed": fast, "product": {"seed": [0, 1]}}), tmp_path / "w",
      max_concurrent=2)
  a, b = record["points"]
  assert record["finished"] == 2, record
  assert a["started_at"] < b["ended_at"] and b["started_at"] < a["ended_at"]
  for p in (a, b):
    assert json.loads((tmp_path / "w" / p["name"] / "summary.json").read_text())["step"] == 4


def test_device_slices_for_gpus_and_tpu_chips():
  """The environment each of several points at once gets on an accelerator host (not run here:
  built and checked as values)."""
  assert launchers.local_devices({"CUDA_VISIBLE_DEVICES": "2,3,5"}) == ("gpu", ["2", "3", "5"])
  assert launchers.local_devices({"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "0"})[0] == "cpu"
  gpus = launchers.device_slices(4, "gpu", [str(i) for i in range(8)], {})
  assert gpus == [{"CUDA_VISIBLE_DEVICES": s} for s in ("0,1", "2,3", "4,5", "6,7")]
  tpus = launchers.device_slices(2, "tpu", ["0", "1", "2", "3"], {})
  assert [t["TPU_VISIBLE_CHIPS"] for t in tpus] == ["0,1", "2,3"]
  assert {t["TPU_CHIPS_PER_PROCESS_BOUNDS"] for t in tpus} == {"1,2,1"}
  assert {t["TPU_PROCESS_BOUNDS"] for t in tpus} == {"1,1,1"}
  assert len({t["TPU_MESH_CONTROLLER_PORT"] for t in tpus}) == 2
  assert all(t["TPU_MESH_CONTROLLER_ADDRESS"] == f"localhost:{t['TPU_MESH_CONTROLLER_PORT']}"
             for t in tpus)
  cpu = launchers.device_slices(2, "cpu", ["0", "1", "2", "3"],
                                {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --x=1"})
  assert cpu == [{"BERTJAX_CPU_CORES": c, "XLA_FLAGS": "--x=1 "
                  "--xla_force_host_platform_device_count=2"} for c in ("0,1", "2,3")]
  with pytest.raises(UserError, match=r"--max_concurrent 3 needs a gpu device for each point; "
                     r"this machine shows 2 \(0,1\)"):
    launchers.device_slices(3, "gpu", ["0", "1"], {})
  with pytest.raises(UserError, match="a slice of one host holds 1, 2, 4, 8 chips"):
    launchers.device_slices(2, "tpu", [str(i) for i in range(6)], {})
