"""Sweeps: points and names, checks before running, local runs that skip and resume, remote
commands (tested as strings: gcloud and ssh never run here)."""

import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from bertjax import sweep
from bertjax.core.errors import UserError
from bertjax.runtime import distributed, metric_writers
from bertjax.tools import report

REPO = pathlib.Path(__file__).resolve().parent.parent

# A tiny model on random batches: each point is mostly process start and compilation.
FAST = ["--config.data.synthetic=True", "--config.model.vocab_size=200",
        "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
        "--config.model.num_attention_heads=2", "--config.max_seq_length=16",
        "--config.max_predictions_per_seq=4", "--config.async_checkpointing=False"]


def run_launch(*args, **kwargs):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "launch.py", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600, **kwargs)


def write_sweep(path: pathlib.Path, body: dict) -> str:
  path.write_text(f"def get_sweep():\n  return {body!r}\n")
  return str(path)


def snapshot(workdir: pathlib.Path) -> dict:
  """Bytes and modification times of every file a point run writes to."""
  out = {}
  for f in sorted(workdir.rglob("*")):
    if f.is_file() and f.name in ("log.txt", "metrics.jsonl", "summary.json", "config.json"):
      out[str(f)] = (f.read_bytes(), f.stat().st_mtime_ns)
  return out


# ---------------------------------------------------------------------------------------------
# Points and names.


def test_point_names_are_sorted_stable_and_file_safe():
  assert sweep.point_name({"seed": 1, "learning_rate": 1e-3}) == "learning_rate=0.001,seed=1"
  assert sweep.point_name({"learning_rate": 5e-5}) == "learning_rate=5e-05"
  assert sweep.point_name({"mesh_shape": (2, 2, -1)}) == "mesh_shape=2x2x-1"
  assert sweep.point_name({"init_from": "/runs/a b"}) == "init_from=_runs_a_b"
  assert sweep.point_name({"optimizer.b2": 0.98}) == "optimizer.b2=0.98"
  assert sweep.point_name({}) == "base"
  long_a = {"data.corpus": "x" * 300 + "a"}
  long_b = {"data.corpus": "x" * 300 + "b"}
  name_a = sweep.point_name(long_a)
  assert len(name_a) <= sweep.MAX_NAME_LEN and name_a == sweep.point_name(dict(long_a))
  assert name_a != sweep.point_name(long_b)
  for name in (name_a, sweep.point_name({"init_from": "/runs/a b", "seed": 3})):
    assert re.fullmatch(r"[A-Za-z0-9._+=,-]+", name), name


def test_product_and_points_cross():
  raw = {"config": "c.py", "points": [{"objective": "mlm"}, {"objective": "rtd", "total_steps": 8}],
         "product": {"seed": [0, 1], "learning_rate": [1e-3]}}
  points = sweep.expand_points(raw, "t")
  assert points == [{"objective": "mlm", "seed": 0, "learning_rate": 1e-3},
                    {"objective": "mlm", "seed": 1, "learning_rate": 1e-3},
                    {"objective": "rtd", "total_steps": 8, "seed": 0, "learning_rate": 1e-3},
                    {"objective": "rtd", "total_steps": 8, "seed": 1, "learning_rate": 1e-3}]
  assert sweep.expand_points({"product": {"seed": [0, 1, 2]}}, "t") == [
      {"seed": 0}, {"seed": 1}, {"seed": 2}]
  assert sweep.expand_points({"points": [{"seed": 4}]}, "t") == [{"seed": 4}]


def test_override_text_round_trips_through_the_config():
  from bertjax.config import config_lib
  config = config_lib.load_config_file(str(REPO / "configs/quickstart.py") + ":runlocal")
  values = {"mesh_shape": (2, 1, -1), "learning_rate": 3e-5, "init_from": "1e-3",
            "data.corpus": "/a/b c.txt", "tensorboard": False, "total_steps": 7}
  config_lib.apply_overrides(config, [f"{k}={sweep.format_value(v)}" for k, v in values.items()])
  for key, value in values.items():
    node = config
    for part in key.split("."):
      node = node[part]
    assert node == value and type(node) is type(value), key


@pytest.mark.parametrize("body, needle", [
    ({"product": {"learning_rat": [1e-3]}}, "unknown config key 'learning_rat'"),
    ({"points": [{"seed": 0}, {"optimizer.nam": "adam"}]}, "unknown config key 'optimizer.nam'"),
    ({"fixed": {"total_stepz": 3}, "product": {"seed": [0]}}, "unknown config key 'total_stepz'"),
    ({"product": {"learning_rate": ["fast"]}}, "learning_rate"),
    ({"product": {"data.corpus": ["a/b", "a_b"]}}, "share the name"),
    ({"points": [{"seed": 1}], "product": {"seed": [2]}}, "'seed' is both"),
    ({"product": {"seed": []}}, "non-empty list"),
    ({"product": {"seed": [0]}, "extra": 1}, "unknown sweep key 'extra'"),
])
def test_bad_sweep_fails_before_running(tmp_path, body, needle):
  path = write_sweep(tmp_path / "bad.py", {"config": "configs/quickstart.py:runlocal", **body})
  with pytest.raises(UserError, match=re.escape(needle)) as e:
    sweep.run_sweep(path, tmp_path / "w")
  assert "\n" not in str(e.value)
  assert not (tmp_path / "w").exists()


def test_unknown_key_exits_2_in_one_line_and_runs_nothing(tmp_path):
  path = write_sweep(tmp_path / "bad.py", {"config": "configs/quickstart.py:runlocal",
                                           "product": {"seed": [0, 1], "learning_rat": [1e-3]}})
  r = run_launch("--sweep", path, "--workdir", str(tmp_path / "w"))
  assert r.returncode == 2, r.stderr[-2000:]
  assert "Traceback" not in r.stderr
  errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "unknown config key 'learning_rat'" in errors[0], r.stderr
  assert not (tmp_path / "w").exists()


def test_swept_key_on_command_line_is_refused(tmp_path):
  with pytest.raises(UserError, match=r"--config\.seed is swept"):
    sweep.run_sweep("experiments/quickstart_sweep.py", tmp_path / "w",
                    overrides=["--config.seed=3"])


# ---------------------------------------------------------------------------------------------
# The sweep files of experiments/.


def test_quickstart_sweep_file():
  s = sweep.load_sweep("experiments/quickstart_sweep.py")
  assert [p.name for p in s.points] == ["learning_rate=0.001,seed=0", "learning_rate=0.001,seed=1",
                                        "learning_rate=0.003,seed=0", "learning_rate=0.003,seed=1"]
  assert {p.resolved["total_steps"] for p in s.points} == {20}  # the runlocal variant


def test_objectives_sweep_file_is_equal_compute():
  s = sweep.load_sweep("experiments/objectives_equal_compute.py")
  objectives = {p.resolved["objective"] for p in s.points}
  assert objectives == {"mlm_nsp", "mlm", "mlm_sop", "span_sbo", "rtd"}
  steps = {p.resolved["objective"]: p.total_steps for p in s.points}
  batch = {p.resolved["batch_size"] for p in s.points}
  assert len(batch) == 1
  # RTD pays for its generator (fraction f of the width: ~f^2 of the FLOPs) with fewer steps.
  assert steps["rtd"] == round(steps["mlm"] / (1 + 0.5 ** 2)) < steps["mlm"] == steps["mlm_nsp"]
  assert len(s.points) == 5 * 3


def test_glue_grid_sweep_file():
  if not (REPO / "configs/glue.py").exists():
    pytest.skip("configs/glue.py (the GLUE fine-tuning configs) is not in this tree yet")
  s = sweep.load_sweep("experiments/glue_bert_grid.py:task=rte+mrpc")
  grid = {(p.resolved["task"], p.resolved["learning_rate"], p.resolved["batch_size"],
           p.resolved["num_epochs"], p.resolved["seed"]) for p in s.points}
  expected = {(t, lr, b, e, seed) for t in ("rte", "mrpc") for lr in (5e-5, 4e-5, 3e-5, 2e-5)
              for b in (16, 32) for e in (2.0, 3.0, 4.0) for seed in (1, 2, 3, 4, 5)}
  assert grid == expected and len(s.points) == len(expected)
  assert {p.resolved["objective"] for p in s.points} == {"glue"}
  raw, _, _ = sweep.load_sweep_spec("experiments/glue_bert_grid.py")  # all 8 tasks, unchecked
  assert len(sweep.expand_points(raw, "grid")) == 8 * 4 * 2 * 3 * 5
  with pytest.raises(UserError, match="task=NAME"):
    sweep.load_sweep("experiments/glue_bert_grid.py:task=wnlx")


# ---------------------------------------------------------------------------------------------
# Remote commands, as strings.


def test_tpu_dry_run_commands_for_a_v4_32_pod(tmp_path):
  path = write_sweep(tmp_path / "two.py", {
      "config": "configs/quickstart.py", "fixed": {"batch_size": 256},
      "product": {"learning_rate": [1e-4, 2e-4]}})
  workdir = "/mnt/gcs/bertjax-runs/lr_sweep"
  r = run_launch("--sweep", path, "--workdir", workdir, "--dry_run", "--tpu", "bert-v4-32",
                 "--zone", "us-central2-b", "--project", "my-project")
  assert r.returncode == 0, r.stderr[-2000:]
  gcloud_ssh = ("gcloud compute tpus tpu-vm ssh bert-v4-32 --zone us-central2-b "
                "--project my-project --worker=all --command")
  launch = ("'cd bertjax && python3 launch.py --config configs/quickstart.py --workdir "
            "/mnt/gcs/bertjax-runs/lr_sweep/learning_rate={lr} --config.batch_size=256 "
            "--config.learning_rate={lr} --config.distributed=True'")
  assert r.stdout.splitlines() == [
      f"sweep {path}: 2 points of configs/quickstart.py in {workdir}",
      "# install the code on every host:",
      "tar -czf /tmp/bertjax_src.tar.gz --exclude=.git --exclude=__pycache__ '--exclude=*.pyc' "
      "--exclude=.pytest_cache '--exclude=*.egg-info' --exclude=runs --exclude=.venv "
      f"--exclude=venv -C {REPO} .",
      "gcloud compute tpus tpu-vm scp /tmp/bertjax_src.tar.gz bert-v4-32:bertjax_src.tar.gz "
      "--zone us-central2-b --project my-project --worker=all",
      f"{gcloud_ssh} 'mkdir -p bertjax && tar -xzf bertjax_src.tar.gz -C bertjax && cd bertjax "
      "&& pip install -q -r requirements.txt \"jax[tpu]\"'",
      "# [1/2] learning_rate=0.0001",
      f"{gcloud_ssh} {launch.format(lr='0.0001')}",
      "# [2/2] learning_rate=0.0002",
      f"{gcloud_ssh} {launch.format(lr='0.0002')}",
  ]
  assert not pathlib.Path(workdir).exists()


def test_remote_command_quoting_survives_two_shells(tmp_path, capsys):
  path = write_sweep(tmp_path / "q.py", {
      "config": "configs/quickstart.py", "fixed": {"mesh_shape": (4, 4, 1)},
      "points": [{"data.corpus": "/data/my corpus.txt"}]})
  sweep.run_sweep(path, "/shared/w", dry_run=True, tpu="t", zone="z")
  lines = capsys.readouterr().out.splitlines()
  outer = shlex.split(lines[-1])
  assert outer[:9] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "t", "--zone", "z",
                       "--worker=all"]
  inner = shlex.split(outer[outer.index("--command") + 1])
  assert "--config.mesh_shape=(4,4,1)" in inner
  assert "--config.data.corpus=/data/my corpus.txt" in inner
  assert inner[inner.index("--workdir") + 1] == "/shared/w/data.corpus=_data_my_corpus.txt"


def test_hosts_dry_run_sets_the_jax_distributed_variables(tmp_path, capsys):
  path = write_sweep(tmp_path / "one.py", {"config": "configs/quickstart.py",
                                           "points": [{"seed": 7}]})
  sweep.run_sweep(path, "/nfs/w", dry_run=True, hosts="me@gpu-a,gpu-b")
  lines = capsys.readouterr().out.splitlines()
  launch = ("python3 launch.py --config configs/quickstart.py --workdir /nfs/w/seed=7 "
            "--config.seed=7 --config.distributed=True")
  assert lines[-3:] == [
      "# [1/1] seed=7",
      "ssh me@gpu-a 'cd bertjax && JAX_COORDINATOR_ADDRESS=gpu-a:8476 JAX_NUM_PROCESSES=2 "
      f"JAX_PROCESS_ID=0 {launch}'",
      "ssh gpu-b 'cd bertjax && JAX_COORDINATOR_ADDRESS=gpu-a:8476 JAX_NUM_PROCESSES=2 "
      f"JAX_PROCESS_ID=1 {launch}'",
  ]
  assert any(l.startswith("rsync -az") and l.endswith(f"{REPO}/ gpu-b:bertjax/") for l in lines)
  assert distributed.jax_distributed_kwargs({"JAX_COORDINATOR_ADDRESS": "gpu-a:8476",
                                       "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}) == {
      "coordinator_address": "gpu-a:8476", "num_processes": 2, "process_id": 1}


def test_remote_flags_are_checked(tmp_path):
  with pytest.raises(UserError, match="needs --zone"):
    sweep.run_sweep("experiments/quickstart_sweep.py", tmp_path, dry_run=True, tpu="t")
  with pytest.raises(UserError, match="not both"):
    sweep.run_sweep("experiments/quickstart_sweep.py", tmp_path, tpu="t", zone="z", hosts="h")


def test_local_processes_flags_are_checked(tmp_path):
  """--local_processes (each point on N local processes): one line for what cannot run."""
  qs = "experiments/quickstart_sweep.py"
  for kwargs, needle in (
      ({"local_processes": 2, "hosts": "h1,h2"}, "give it or --tpu/--hosts, not both"),
      ({"devices_per_process": 2}, "--devices_per_process goes with --local_processes"),
      ({"local_processes": 1}, "--local_processes=1 must be at least 2"),
      ({"local_processes": 2, "devices_per_process": 0}, "--devices_per_process=0 must be"),
      ({"local_processes": 3}, "batch_size=8, which does not split over --local_processes=3")):
    with pytest.raises(UserError, match=re.escape(needle)) as e:
      sweep.run_sweep(qs, tmp_path / "w", dry_run=True, **kwargs)
    assert "\n" not in str(e.value)
  assert not (tmp_path / "w").exists()
  r = run_launch("--config", "configs/quickstart.py:runlocal", "--workdir", str(tmp_path / "w"),
                 "--local_processes=2")
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert r.stderr.strip().splitlines() == [
      "error: --tpu, --hosts, --local_processes and --max_concurrent go with --sweep "
      "experiments/<name>.py (one run on several local processes: python -m "
      "bertjax.tools.multihost)"]


def test_local_processes_dry_run_runs_each_point_through_the_multihost_launcher(tmp_path,
                                                                                capsys):
  path = write_sweep(tmp_path / "one.py", {"config": "configs/quickstart.py:runlocal",
                                           "points": [{"seed": 7}]})
  record = sweep.run_sweep(path, tmp_path / "w", dry_run=True, local_processes=2,
                           devices_per_process=3)
  lines = capsys.readouterr().out.splitlines()
  assert lines[-1] == shlex.join([
      sys.executable, "-m", "bertjax.tools.multihost", "--processes", "2",
      "--devices-per-process", "3", "--", "launch.py", "--config", "configs/quickstart.py:runlocal",
      "--workdir", str(tmp_path / "w" / "seed=7"), "--config.seed=7",
      "--config.distributed=True"])
  assert record["mode"] == "local, 2 processes each"


def test_the_line_of_a_failed_multi_process_point_is_its_first_error():
  log = ("[p1] 10:00:01 INFO model: 1 parameters\n"
         "[p0] error: mesh_shape=(1, 1, 4) splits the batch 1 ways\n"
         "[p1] error: mesh_shape=(1, 1, 4) splits the batch 1 ways (process 1)\n"
         "multihost: process 0 exited with status 2; stopping the others\n"
         "[p1] preempted: SIGTERM while loading the libraries\n")
  assert sweep.last_line(log) == "[p0] error: mesh_shape=(1, 1, 4) splits the batch 1 ways"
  assert sweep.last_line("a\nTraceback\nValueError: x\n") == "ValueError: x"


# ---------------------------------------------------------------------------------------------
# Local runs.


@pytest.mark.slow
def test_quickstart_sweep_end_to_end_then_rerun_skips(tmp_path):
  workdir = tmp_path / "qs"
  args = ["--sweep", "experiments/quickstart_sweep.py", "--workdir", str(workdir), *FAST,
          "--config.total_steps=4", "--config.log_every=1", "--config.eval_every=4",
          "--config.checkpoint_every=4"]
  dry = run_launch(*args, "--dry_run")
  assert dry.returncode == 0, dry.stderr[-2000:]
  assert sum("launch.py --config configs/quickstart.py:runlocal" in l
             for l in dry.stdout.splitlines()) == 4
  assert not workdir.exists()

  first = run_launch(*args)
  assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
  record = json.loads((workdir / "sweep.json").read_text())
  expected = {(lr, seed) for lr in (1e-3, 3e-3) for seed in (0, 1)}
  assert {(p["overrides"]["learning_rate"], p["overrides"]["seed"])
          for p in record["points"]} == expected
  for p in record["points"]:
    point_dir = workdir / p["name"]
    assert p["status"] == "finished" and p["runs"] == 1, p
    lr, seed = p["overrides"]["learning_rate"], p["overrides"]["seed"]
    assert p["name"] == f"learning_rate={lr!r},seed={seed}"
    config = json.loads((point_dir / "config.json").read_text())
    assert config["learning_rate"] == p["overrides"]["learning_rate"]
    assert config["seed"] == p["overrides"]["seed"] and config["total_steps"] == 4
    assert json.loads((point_dir / "summary.json").read_text())["step"] == 4
    assert "summary:" in (point_dir / "log.txt").read_text()
    assert f"--workdir {point_dir}" in p["command"]

  result = report.write_report(workdir)
  table = (workdir / "report.md").read_text()
  assert all(f"| {p['name']} |" in table for p in record["points"])
  assert (workdir / "train_loss.png").stat().st_size > 0
  assert len(json.loads((workdir / "train_loss.json").read_text())["curves"]) == 4
  assert len(result["seed_groups"]) == 2  # one per learning rate, over seeds 0 and 1

  before = snapshot(workdir)
  assert len(before) == 4 * 4
  second = run_launch(*args)
  assert second.returncode == 0, second.stderr[-2000:]
  assert "4 already finished, 0 to run" in second.stdout
  assert "[1/" not in second.stdout  # no point launched
  assert snapshot(workdir) == before  # logs, metrics and summaries untouched
  record = json.loads((workdir / "sweep.json").read_text())
  assert [(p["status"], p["runs"], p["skipped"]) for p in record["points"]] == [
      ("finished", 1, True)] * 4


def _checkpoint_steps(point_dir: pathlib.Path) -> list[int]:
  ckpt = point_dir / "checkpoints"
  return sorted(int(d.name) for d in ckpt.iterdir() if d.name.isdigit()) if ckpt.exists() else []


@pytest.mark.slow
def test_killed_point_resumes_from_its_checkpoint(tmp_path):
  path = write_sweep(tmp_path / "one.py", {"config": "configs/quickstart.py:runlocal",
                                           "points": [{"seed": 3}]})
  workdir = tmp_path / "w"
  args = ["launch.py", "--sweep", path, "--workdir", str(workdir), *FAST, "--config.total_steps=24",
          "--config.checkpoint_every=2", "--config.log_every=1", "--config.eval_every=0",
          "--config.tensorboard=False"]
  point_dir = workdir / "seed=3"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  # Its own session, so the sweep and the point it runs are killed together, as in a crash.
  proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, start_new_session=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + 300
    while not _checkpoint_steps(point_dir):
      assert proc.poll() is None, "the sweep ended before its point wrote a checkpoint"
      assert time.time() < deadline, "no checkpoint appeared"
      time.sleep(0.02)
  finally:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
  assert not (point_dir / "summary.json").exists()  # killed midway
  assert json.loads((workdir / "sweep.json").read_text())["points"][0]["status"] == "running"

  r = run_launch(*args[1:])
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  log = (point_dir / "log.txt").read_text()
  assert log.count("# bertjax.sweep ") == 2  # launched twice, both runs in one log
  resumed = re.findall(r"resumed from the checkpoint at step (\d+)", log)
  assert len(resumed) == 1 and 0 < int(resumed[0]) < 24, log[-3000:]
  step = int(resumed[0])
  rows = metric_writers.read_metrics(point_dir)
  train_steps = [row["step"] for row in rows if row["split"] == "train"]
  assert train_steps.count(1) == 1  # not restarted from scratch
  assert train_steps[-(24 - step):] == list(range(step + 1, 25))
  summary = json.loads((point_dir / "summary.json").read_text())
  assert summary["status"] == "finished" and summary["step"] == 24
  entry = json.loads((workdir / "sweep.json").read_text())["points"][0]
  assert entry["status"] == "finished" and entry["runs"] == 2


@pytest.mark.slow
def test_points_share_their_corpus_and_the_sweep_shows_their_progress(tmp_path, capsys,
                                                                      monkeypatch):
  """Two seeds of a run on raw text: the first point trains the tokenizer and prepares the
  corpus, the second copies them (the same files); while each runs, the sweep prints its latest
  progress line. On dd89774 every point prepared its own and the sweep printed nothing while a
  point ran."""
  from bertjax.sweep import runner  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(runner, "PROGRESS_EVERY_S", 0.5)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  text = tmp_path / "corpus.txt"
  lines = (REPO / "bertjax/data/samples/wikitext2_test.raw").read_text().splitlines()[:300]
  text.write_text("\n".join(lines) + "\n")
  path = write_sweep(tmp_path / "two.py", {
      "config": "configs/quickstart.py:runlocal",
      "fixed": {"data.corpus": str(text), "data.vocab_size": 200, "model.vocab_size": 200,
                "total_steps": 2, "eval_every": 0, "checkpoint_every": 2, "log_every": 1,
                "progress_every_s": 0.0, "tensorboard": False},
      "points": [{"seed": 0}, {"seed": 1}]})
  record = sweep.run_sweep(path, tmp_path / "w")
  assert record["finished"] == 2, record
  out = capsys.readouterr().out
  assert re.search(r"^\[1/2\] seed=0: train step \d+/2", out, re.M), out
  assert re.search(r"^\[2/2\] seed=1: train step \d+/2", out, re.M), out

  first, second = tmp_path / "w" / "seed=0", tmp_path / "w" / "seed=1"
  assert "training a sentencepiece tokenizer" in (first / "log.txt").read_text()
  log = (second / "log.txt").read_text()
  assert "training a sentencepiece tokenizer" not in log
  assert "using the corpus and tokenizer prepared for another point of this sweep" in log
  files = lambda d: {str(f.relative_to(d)): f.read_bytes()
                     for f in sorted((d / "prepared").rglob("*")) if f.is_file()}
  assert files(first) == files(second) and "prepared/meta.json" in files(first)


@pytest.mark.slow
def test_a_sweep_whose_points_run_on_two_local_processes(tmp_path, monkeypatch):
  """Two points (seeds 0 and 1), each on 2 local processes x 2 devices (`--local_processes 2
  --devices_per_process 2`): both finish, each log holds both processes' lines and process 0's
  end, each record says the run was distributed, and a rerun skips them."""
  workdir = tmp_path / "w"
  path = write_sweep(tmp_path / "two.py", {"config": "configs/quickstart.py:runlocal",
                                           "product": {"seed": [0, 1]}})
  args = ["--sweep", path, "--workdir", str(workdir), "--local_processes=2",
          "--devices_per_process=2", *FAST, "--config.total_steps=4", "--config.log_every=2",
          "--config.eval_every=4", "--config.checkpoint_every=4"]
  monkeypatch.setenv("BERTJAX_JOIN_TIMEOUT_S", "60")  # a stuck point fails in minutes, not hours
  monkeypatch.setenv("BERTJAX_HEARTBEAT_TIMEOUT_S", "15")
  first = run_launch(*args)
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
  record = json.loads((workdir / "sweep.json").read_text())
  assert [(p["name"], p["status"]) for p in record["points"]] == [
      ("seed=0", "finished"), ("seed=1", "finished")]
  for p in record["points"]:
    point_dir = workdir / p["name"]
    log = (point_dir / "log.txt").read_text()
    assert "[p0] train step 4/4:" in log and "[p1] " in log, log[-2000:]
    assert f"[p0] run finished at step 4: {point_dir}" in log
    assert json.loads((point_dir / "config.json").read_text())["distributed"] is True
    assert json.loads((point_dir / "summary.json").read_text())["step"] == 4
    assert [r["step"] for r in metric_writers.read_metrics(point_dir)
            if r["split"] == "train"] == [2, 4]  # one record, process 0's
  second = run_launch(*args)
  assert second.returncode == 0 and "2 already finished, 0 to run" in second.stdout


def test_a_finished_point_with_other_settings_is_refused_not_skipped(tmp_path, capsys):
  """ea9bcfe, re-running a finished sweep with --config.learning_rate=3e-3, printed `2 already
  finished, 0 to run` and `sweep done`, status 0, and rewrote sweep.json to record 0.003 and
  the new commands for points trained at 0.001. Finished points are faked here (summary.json,
  config.json): nothing is launched either way."""
  spec = write_sweep(tmp_path / "s.py", {"config": "configs/quickstart.py:runlocal",
                                         "fixed": {"total_steps": 4, "log_every": 1},
                                         "product": {"seed": [0, 1]}})
  workdir = tmp_path / "sweep"
  for seed in (0, 1):
    point = workdir / f"seed={seed}"
    point.mkdir(parents=True)
    (point / "summary.json").write_text(json.dumps({"status": "finished", "step": 4}))
    (point / "config.json").write_text(json.dumps(
        {"objective": "mlm_nsp", "learning_rate": 0.001, "seed": seed, "total_steps": 4,
         "log_every": 5}))
  (workdir / "sweep.json").write_text('{"points": []}\n')
  with pytest.raises(UserError) as e:
    sweep.run_sweep(spec, workdir, overrides=["--config.learning_rate=3e-3"])
  assert str(e.value) == (f"point seed=0 in {workdir} finished with learning_rate=0.001, and "
                          "this sweep gives learning_rate=0.003; a finished point is not run "
                          "again: use a new --workdir for other settings, or give the ones it "
                          "finished with")
  assert (workdir / "sweep.json").read_text() == '{"points": []}\n'
  # The settings it finished with (log_every, a cadence, may differ): skipped, as before.
  record = sweep.run_sweep(spec, workdir, overrides=["--config.learning_rate=1e-3"])
  assert [(p["status"], p["skipped"]) for p in record["points"]] == [("finished", True)] * 2
  assert "2 already finished, 0 to run" in capsys.readouterr().out
