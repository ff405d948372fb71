"""`python -m bertjax.tools.benchmark --ablate SPEC`: the reference first, one row per variant,
failures and timeouts reported in their rows; the spec reader refuses malformed specs in one
line."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from bertjax.core.errors import UserError
from bertjax.tools import ablate, benchmark

REPO = pathlib.Path(__file__).resolve().parent.parent

# A stand-in for the PyTorch reference: its own clock reading and fixed figures.
FAKE_REFERENCE = """
import json, sys, time
started = time.time()
time.sleep(0.5)
print(json.dumps({"framework": sys.argv[-1], "tokens_per_s": 100.0, "step_time_s": 0.32,
                  "peak_memory_bytes": 2**20, "own_start": started, "own_end": time.time()}))
"""
# A variant that is not the benchmark: it reports its own clock reading and fixed figures.
CLOCK_VARIANT = ("import json, time; print(json.dumps({'tokens_per_s': 400.0, "
                 "'step_time_s': 0.08, 'own_start': time.time()}))")


def write_spec(path, variants, **base):
  spec = {"base": {"preset": "bert-tiny", "batch_size": 2, "seq_len": 16, "steps": 1,
                   "overrides": ["max_predictions_per_seq=4"], **base}, "variants": variants}
  path.write_text(json.dumps(spec))
  return path


@pytest.mark.parametrize("spec,message", [
    ({"variants": []}, "variants must be a non-empty list"),
    ({"variants": [{"overrides": []}]}, "variant 0 has no name"),
    ({"variants": [{"name": "a"}, {"name": "a"}]}, "two variants are named 'a'"),
    ({"variants": [{"name": "a", "batchsize": 8}]}, "unknown key 'batchsize'"),
    ({"variants": [{"name": "a", "overrides": "x=1"}]}, "overrides='x=1' must be list"),
    ({"variants": [{"name": "a", "overrides": ["model.dtype"]}]}, "has no value"),
    ({"variants": [{"name": "a", "kind": "loop"}]}, "kind='loop'; use one of step"),
    ({"variants": [{"name": "a", "remat": "some"}]}, "remat='some'"),
    ({"variants": [{"name": "a", "env": {"X": 1}}]}, "env must map names to string values"),
    ({"variants": [{"name": "a", "kind": "command"}]}, "needs a command list"),
    ({"base": {"references": ["hf-jax"]}, "variants": [{"name": "a"}]}, "reference 'hf-jax'"),
    ({"base": {"name": "a"}, "variants": [{"name": "b"}]}, "unknown key 'name' in"),
    ([{"name": "a"}], "give a base dict and a variants list"),
    # dd89774: a null reached the runs as a traceback (TypeError) after the compile phase
    ({"base": {"references": None}, "variants": [{"name": "a"}]}, "references is null"),
    ({"base": {"preset": None}, "variants": [{"name": "a"}]}, "preset is null"),
    ({"variants": [{"name": "a", "trainer_steps": None}]}, "trainer_steps is null"),
])
def test_malformed_specs_fail_in_one_line(tmp_path, spec, message):
  path = tmp_path / "spec.json"
  path.write_text(json.dumps(spec))
  with pytest.raises(UserError, match=message) as e:
    ablate.load_spec(str(path))
  assert "\n" not in str(e.value)


def test_spec_files_that_do_not_parse_fail_in_one_line(tmp_path):
  (tmp_path / "bad.json").write_text("{base: }")
  (tmp_path / "bad.py").write_text("BASE = {}\n")
  (tmp_path / "broken.py").write_text("VARIANTS = [\n")
  for name, message in (("bad.json", "not valid JSON"), ("bad.py", "define VARIANTS"),
                        ("broken.py", r"broken.py:1: .*syntax error in the ablation spec file"), ("nope", "no such file or named set")):
    with pytest.raises(UserError, match=message) as e:
      ablate.load_spec(str(tmp_path / name) if name != "nope" else name)
    assert "\n" not in str(e.value)


def test_named_sets_load_and_python_specs_merge_with_their_base(tmp_path):
  for name in ablate.NAMED_SETS:
    spec = ablate.load_spec(name)
    assert len({v["name"] for v in spec["variants"]}) == len(spec["variants"]) >= 2
  path = tmp_path / "spec.py"
  path.write_text("BASE = {'overrides': ['a=1'], 'env': {'X': '1'}, 'xla_flags': ['--f=1']}\n"
                  "VARIANTS = [{'name': 'v', 'overrides': ['b=2'], 'env': {'Y': '2'},\n"
                  "             'xla_flags': ['--g=2'], 'batch_size': 8, 'remat': 'dots'}]\n")
  spec = ablate.load_spec(str(path))
  s = ablate.settings(spec["base"], spec["variants"][0])
  assert s["overrides"] == ["a=1", "b=2"] and s["env"] == {"X": "1", "Y": "2"}
  args = ablate.benchmark_args(s)
  assert args[:2] == ["--preset", "bert-base"] and "--batch_size" in args
  assert args[args.index("--remat") + 1] == "dots"
  assert [args[i + 1] for i, a in enumerate(args) if a == "--override"] == ["a=1", "b=2"]
  assert ablate.environment(s)["XLA_FLAGS"].split()[-2:] == ["--f=1", "--g=2"]
  trainer = ablate.trainer_args(s, "/tmp/w")
  assert trainer[1:4] == ["launch.py", "--config", "configs/bert.py:size=base"]
  assert "--config.batch_size=8" in trainer and "--config.b=2" in trainer


def test_trainer_rows_skip_the_first_window_and_borrow_flops(tmp_path):
  rows = [{"step": 20, "split": "train", "tokens_per_s": 10.0, "steps_per_s": 1.0},
          {"step": 40, "split": "train", "tokens_per_s": 300.0, "steps_per_s": 3.0},
          {"step": 40, "split": "eval", "loss": 1.0},
          {"step": 60, "split": "train", "tokens_per_s": 500.0, "steps_per_s": 5.0}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  figures = ablate.trainer_figures(tmp_path)
  assert figures["tokens_per_s"] == 400.0 and figures["step_time_s"] == pytest.approx(0.25)
  # counted as the benchmark counts: every slot of batch x seq at the median step rate
  slots = ablate.trainer_figures(tmp_path, slots=8 * 16)
  assert slots["tokens_per_s"] == pytest.approx(4.0 * 128) and slots["real_tokens_per_s"] == 400.0
  trainer = {"kind": "trainer", "tokens_per_s": 400.0, "settings": {"batch_size": 8}}
  steps = [{"name": "other", "kind": "step", "status": "ok", "settings": {"batch_size": 4},
            "model_flops_per_token": 1.0, "peak_flops": 1.0},
           {"name": "same", "kind": "step", "status": "ok", "settings": {"batch_size": 8},
            "model_flops_per_token": 5.0, "peak_flops": 1e4}]
  ablate.trainer_mfu(trainer, steps)
  assert trainer["mfu"] == pytest.approx(0.2) and trainer["mfu_from"] == "same"


def test_compare_times_the_reference_before_the_jax_step(monkeypatch):
  """--compare: the reference's process has finished before this process builds its step (and
  so before JAX takes the device's memory); --reference_only never builds it."""
  order = []
  reference = {"framework": "hf-torch", "tokens_per_s": 10.0, "step_time_s": 1.0,
               "peak_memory_bytes": 1}
  monkeypatch.setattr(benchmark, "_torch_subprocess",
                      lambda *a, **k: order.append("reference") or reference)
  monkeypatch.setattr(benchmark, "bench_jax", lambda *a, **k: order.append("jax") or {
      "tokens_per_s": 20.0, "step_time_s": 0.5, "compile_time_s": 1.0, "mfu": 0.1,
      "peak_source": "x", "peak_memory_bytes": 2})
  flags = ["--preset", "bert-tiny", "--batch_size", "2", "--seq_len", "16", "--steps", "1",
           "--compare", "hf-torch"]
  result = benchmark.main(flags)
  assert order == ["reference", "jax"] and result["speedup_vs_reference"] == 2.0
  order.clear()
  assert benchmark.main(flags + ["--reference_only"]) == reference and order == ["reference"]


@pytest.mark.slow
def test_ablate_writes_one_row_per_variant_after_the_reference(tmp_path):
  """One real benchmark variant, one with a bad override, one that outlives its timeout and one
  command; the fake reference runs first. The parent runs with JAX_PLATFORMS naming no platform:
  had it touched a device it would have failed; the variants run on the CPU."""
  (tmp_path / "reference.py").write_text(FAKE_REFERENCE)
  spec = write_spec(tmp_path / "spec.json", [
      {"name": "tiny"},
      {"name": "bad override", "overrides": ["model.no_such_key=1"]},
      {"name": "sleeper", "kind": "command", "timeout": 3,
       "command": ["{python}", "-c", "import time; time.sleep(60)"]},
      {"name": "clock", "kind": "command", "command": ["{python}", "-c", CLOCK_VARIANT]},
  ], env={"JAX_PLATFORMS": "cpu"}, references=["hf-torch", "hf-torch-compile"],
      reference_command=["{python}", str(tmp_path / "reference.py")])
  out = tmp_path / "out" / "table.md"
  env = dict(os.environ, JAX_PLATFORMS="no_such_platform")
  r = subprocess.run([sys.executable, "-m", "bertjax.tools.benchmark", "--ablate", str(spec),
                      "--output", str(out), "--timeout", "300"],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  table = out.read_text()
  assert table in r.stdout and sorted(p.name for p in out.parent.iterdir()) == [
      "table.json", "table.md", "table.profiles"]  # no temporary file left
  assert [p.name for p in (out.parent / "table.profiles").iterdir()] == ["tiny"]
  rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()
          if line.startswith("| ") and " | " in line}
  assert set(rows) == {"variant", "hf-torch", "hf-torch-compile", "tiny", "bad override",
                       "sleeper", "clock"}
  assert "failed: error: unknown config key 'model.no_such_key'" in rows["bad override"]
  assert "timed out: timed out after 3 s" in rows["sleeper"]
  assert "| clock | command | 400 |" in rows["clock"] and "4.00x" in rows["clock"]
  record = json.loads(out.with_suffix(".json").read_text())
  by_name = {x["name"]: x for x in record["references"] + record["rows"]}
  tiny = by_name["tiny"]
  assert tiny["status"] == "ok" and tiny["tokens_per_s"] > 0 and tiny["device"] == "cpu"
  assert f"| tiny | step | {tiny['tokens_per_s']:,.0f} | {tiny['mfu']:.3f} |" in rows["tiny"]
  assert by_name["sleeper"]["ended"] - by_name["sleeper"]["started"] < 60  # killed, not awaited
  # The order, from the recorded clocks: both references ended before any variant started, and
  # the reference processes' own readings precede the variant's own.
  refs, variants = record["references"], record["rows"]
  assert [x["name"] for x in refs] == ["hf-torch", "hf-torch-compile"]
  assert max(x["ended"] for x in refs) <= min(x["started"] for x in variants)
  assert refs[0]["own_end"] <= refs[1]["own_start"]
  assert max(x["own_end"] for x in refs) < by_name["clock"]["own_start"]


@pytest.mark.parametrize("name", ablate.NAMED_SETS)
def test_named_sets_build_valid_configs(name):
  """Every benchmark-step variant of a named set builds a config whose model settings are valid
  (a misspelt setting or value fails here, not in a device window)."""
  from bertjax.models.config import ModelConfig  # pylint: disable=import-outside-toplevel
  from bertjax.config import config_checks, config_lib  # pylint: disable=import-outside-toplevel
  spec = ablate.load_spec(name)
  checked = 0
  for variant in spec["variants"]:
    s = ablate.settings(spec["base"], variant)
    if s.get("kind") == "trainer":  # launch.py's config with the row's overrides, checked
      argv = ablate.trainer_args(s, "/nonexistent")
      config = config_lib.load_config_file(argv[argv.index("--config") + 1])
      config_lib.apply_overrides(config, [a.removeprefix("--config.") for a in argv
                                          if a.startswith("--config.")])
      config_checks.check_settings(config)
      continue
    if s.get("kind", "step") != "step":
      continue
    config = benchmark.build_config(benchmark.parse_args(ablate.benchmark_args(s)))
    ModelConfig(**config.model.to_dict())
    checked += 1
  assert checked >= 2


# ------------------------------------------------------------------ first-use and fault findings


def test_a_binary_or_exiting_spec_fails_in_one_line(tmp_path):
  """dd89774: a binary .json spec was a UnicodeDecodeError traceback, and a spec calling
  sys.exit(0) ended the ablation with status 0 and no table."""
  (tmp_path / "binary.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
  (tmp_path / "exits.py").write_text("import sys\nsys.exit(0)\nVARIANTS = [{'name': 'a'}]\n")
  for name, message in (("binary.json", "is not valid UTF-8"),
                        ("exits.py", r"called sys.exit\(0\)")):
    with pytest.raises(UserError, match=message) as e:
      ablate.load_spec(str(tmp_path / name))
    assert "\n" not in str(e.value)


def marker_spec(tmp_path):
  """A spec whose one variant, a command, leaves a file when it runs."""
  marker = tmp_path / "ran"
  return write_spec(tmp_path / "spec.json", [
      {"name": "marker", "kind": "command",
       "command": ["{python}", "-c", f"open({str(marker)!r}, 'w').write('x'); {CLOCK_VARIANT}"]}],
      references=[]), marker


@pytest.mark.parametrize("case", ["exists", "folder", "unwritable", "empty", "json", "timeout",
                                  "budget", "parallel"])
def test_arguments_and_output_are_checked_before_anything_runs(tmp_path, case):
  """dd89774: --output was checked only after every variant ran (a traceback after the
  measurements for a folder or a read-only one; an earlier table overwritten without a word),
  and a negative --timeout or an empty --output were taken."""
  spec, marker = marker_spec(tmp_path)
  out, kwargs, message = tmp_path / "t.md", {}, None
  if case == "exists":
    out.write_text("an earlier table")
    message = "exists .*add --overwrite"
  elif case == "folder":
    out = tmp_path / "folder"
    out.mkdir()
    message = "is a folder"
  elif case == "unwritable":  # a folder that cannot be made (a file in the way; as root, a
    (tmp_path / "file").write_text("x")  # read-only folder would still be writable)
    out = tmp_path / "file" / "sub" / "t.md"
    message = "cannot write into"
  elif case == "empty":
    out, message = "", "--output is empty"
  elif case == "json":
    out, message = tmp_path / "t.json", "give the table's path"
  elif case == "timeout":
    kwargs, message = {"timeout": -1}, "--timeout -1 must be a positive"
  elif case == "budget":
    kwargs, message = {"budget": 0}, "--budget 0 must be a positive"
  else:
    kwargs, message = {"parallel": 0}, "--parallel 0 must be at least 1"
  with pytest.raises(UserError, match=message) as e:
    ablate.run_ablation(str(spec), str(out), **kwargs)
  assert "\n" not in str(e.value) and not marker.exists()
  if case == "exists":
    assert out.read_text() == "an earlier table"
    record = ablate.run_ablation(str(spec), str(out), overwrite=True)  # asked for: replaced
    assert marker.exists() and record["rows"][0]["status"] == "ok"
    assert "| marker | command |" in out.read_text()


def test_budget_stops_the_running_variant_and_writes_the_table(tmp_path):
  """A 3 s budget: the sleeping variant is stopped when it is spent, the next is not started,
  both rows say so, and the table is written (exit 0)."""
  spec = write_spec(tmp_path / "spec.json", [
      {"name": "quick", "kind": "command", "command": ["{python}", "-c", CLOCK_VARIANT]},
      {"name": "sleeper", "kind": "command",
       "command": ["{python}", "-c", "import time; time.sleep(120)"]},
      {"name": "after", "kind": "command", "command": ["{python}", "-c", CLOCK_VARIANT]}],
      references=[])
  out = tmp_path / "t.md"
  r = subprocess.run([sys.executable, "-m", "bertjax.tools.benchmark", "--ablate", str(spec),
                      "--output", str(out), "--budget", "3"], cwd=REPO, capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  rows = {x["name"]: x for x in json.loads(out.with_suffix(".json").read_text())["rows"]}
  assert rows["quick"]["status"] == "ok"
  assert rows["sleeper"]["status"] == "stopped" and "budget" in rows["sleeper"]["error"]
  assert rows["sleeper"]["ended"] - rows["sleeper"]["started"] < 30
  assert rows["after"]["status"] == "not run"
  table = out.read_text()
  assert "| sleeper | command |" in table and "not run: the --budget was spent" in table
  assert "budget of 3 s was spent" in r.stdout


def wait_for(predicate, seconds=60.0):
  deadline = time.time() + seconds
  while time.time() < deadline:
    if predicate():
      return True
    time.sleep(0.1)
  return False


def handles_sigterm(pid: int) -> bool:
  """Whether the process has a handler for SIGTERM installed (its SigCgt mask in /proc)."""
  try:
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
  except OSError:
    return False
  caught = int(re.search(r"SigCgt:\s*([0-9a-f]+)", status).group(1), 16)
  return bool(caught & (1 << (signal.SIGTERM - 1)))


def alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  status = pathlib.Path(f"/proc/{pid}/status")
  return not (status.exists() and re.search(r"State:\s*Z", status.read_text()))


@pytest.mark.slow
def test_sigterm_stops_the_ablation_and_its_running_variant(tmp_path):
  """dd89774: SIGTERM to `--ablate` exited 143 with no line and left the running variant's
  process (holding the accelerator) behind. Now: exit 75, one line, the variant's process gone,
  the table written with the rows not measured marked."""
  pid_file = tmp_path / "child.pid"
  child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
  spec = write_spec(tmp_path / "spec.json", [
      {"name": "quick", "kind": "command", "command": ["{python}", "-c", CLOCK_VARIANT]},
      {"name": "holder", "kind": "command", "command": ["{python}", "-c", child]},
      {"name": "after", "kind": "command", "command": ["{python}", "-c", CLOCK_VARIANT]}],
      references=[])
  out = tmp_path / "t.md"
  proc = subprocess.Popen([sys.executable, "-m", "bertjax.tools.benchmark", "--ablate", str(spec),
                           "--output", str(out)], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  try:
    assert wait_for(lambda: pid_file.exists() and pid_file.read_text()), "the variant never ran"
    held = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
  finally:
    proc.kill()
  assert proc.returncode == 75, err
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("preempted: SIGTERM during the ablation"), err
  assert "Traceback" not in err and str(out) in lines[0]
  assert wait_for(lambda: not alive(held), 10), "the running variant's process was left behind"
  rows = {x["name"]: x["status"] for x in json.loads(out.with_suffix(".json").read_text())["rows"]}
  assert rows == {"quick": "ok", "holder": "not run", "after": "not run"}


@pytest.mark.slow
def test_sigterm_to_the_plain_benchmark_exits_75(tmp_path):
  """dd89774: the plain benchmark died of SIGTERM (143) where every tool promises 75."""
  proc = subprocess.Popen([sys.executable, "-m", "bertjax.tools.benchmark", "--preset",
                           "bert-tiny", "--batch_size", "2", "--seq_len", "16", "--steps", "100000",
                           "--override", "max_predictions_per_seq=4"], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    assert wait_for(lambda: handles_sigterm(proc.pid), 120)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == 75, err[-2000:]
  assert err.strip().splitlines()[-1].startswith("preempted: SIGTERM during the benchmark")


# The plain benchmark as its process runs it, sent SIGTERM a second after its batches reach the
# device (shard_batch's second call): during the warm-up or the timed steps.
DURING_THE_STEPS = """
import os, runpy, signal, sys, threading
from bertjax.runtime import sharding
original, calls = sharding.shard_batch, []
def shard_batch(*args, **kwargs):
  calls.append(1)
  if len(calls) == 2:
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
  return original(*args, **kwargs)
sharding.shard_batch = shard_batch
sys.argv = ["benchmark", *sys.argv[1:]]
runpy.run_module("bertjax.tools.benchmark", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_sigterm_during_the_timed_steps_exits_75_between_steps(tmp_path):
  """A SIGTERM while the compiled steps run is acted on between two steps (noted by
  `sigterm_between_steps`, not raised inside JAX's `block_until_ready`): exit 75 with the line,
  and the benchmark's own handler is what a SIGTERM meets outside the steps."""
  command = [sys.executable, "-c", DURING_THE_STEPS, "--preset", "bert-tiny", "--batch_size", "2",
             "--seq_len", "16", "--steps", "100000", "--override", "max_predictions_per_seq=4"]
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"))
  run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert run.returncode == 75, run.stderr[-3000:]
  assert run.stderr.strip().splitlines()[-1].startswith("preempted: SIGTERM during the benchmark")
  assert "Traceback" not in run.stderr and "Fatal Python error" not in run.stderr


def test_sigterm_between_steps_raises_at_the_check_and_restores_the_handler():
  from bertjax.core.errors import Preempted  # pylint: disable=import-outside-toplevel
  from bertjax.tools import benchmark  # pylint: disable=import-outside-toplevel
  before = signal.getsignal(signal.SIGTERM)
  with pytest.raises(Preempted, match="SIGTERM during the benchmark"):
    with benchmark.sigterm_between_steps() as check:
      check()  # nothing came yet
      os.kill(os.getpid(), signal.SIGTERM)  # noted by the handler, which raises nothing
      noted = True
      check()
  assert noted and signal.getsignal(signal.SIGTERM) is before
  with pytest.raises(Preempted):  # one after the last step's check: raised on leaving
    with benchmark.sigterm_between_steps():
      os.kill(os.getpid(), signal.SIGTERM)
  assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.slow
def test_cpu_smoke_compiles_ahead_in_parallel_then_times_from_the_cache(tmp_path):
  """The named CPU set end to end with an empty compilation cache: the compile-ahead processes
  overlap; every timed row then loads its train step from the cache (the benchmark's rows by
  JAX's cache events, the trainer's by writing no new cache entry); every row carries its kernel
  count and top operations, and the operation tables lie beside the table."""
  out = tmp_path / "cpu-smoke.md"
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"))
  r = subprocess.run([sys.executable, "-m", "bertjax.tools.benchmark", "--ablate", "cpu-smoke",
                      "--output", str(out), "--parallel", "2"], cwd=REPO, env=env,
                     capture_output=True, text=True, timeout=1500)
  assert r.returncode == 0, r.stderr[-3000:]
  record = json.loads(out.with_suffix(".json").read_text())
  ahead = record["compile_ahead"]
  assert ahead["parallel"] == 2 and ahead["cache"] == str(tmp_path / "cache")
  compiled = list(ahead["variants"].values())
  assert len(compiled) == 3 and all(v["status"] == "ok" for v in compiled), ahead
  first, second = compiled[:2]
  assert second["started"] < first["ended"] and first["started"] < second["ended"]  # overlapped
  assert max(v["ended"] for v in compiled) <= min(x["started"] for x in record["rows"])
  rows = {x["name"]: x for x in record["rows"]}
  assert set(rows) == {"default", "dropout 0", "trainer"}
  for name, row in rows.items():
    assert row["status"] == "ok", (name, row.get("error"))
    assert row["step_cache"]["hits"] >= 1 and row["step_cache"]["misses"] == 0, (name, row)
    assert row["kernels_per_step"] > 0 and row["top_ops"], (name, row)
    assert pathlib.Path(row["profile_table"]).is_file()
  assert rows["trainer"]["profile_from"]
  table = out.read_text()
  assert "| step from | kernels/step |" in table
  assert "Compiled ahead: 3 variants, 2 at a time" in table
  assert table.count("| cache |") == 3


def test_lengths_and_pack_reach_the_benchmark_and_the_table_shows_real_tokens(tmp_path):
  """Spec keys lengths/pack become --lengths and --pack/--no-pack on step rows; elsewhere, or
  malformed, one line; the table has a real tokens/s column beside the slot count."""
  spec = ablate.load_spec("modernbert-base-1024")
  rows = {v["name"]: ablate.benchmark_args(ablate.settings(spec["base"], v))
          for v in spec["variants"] if v["name"].startswith("ragged")}
  padded = rows["ragged padded"]
  assert padded[padded.index("--lengths") + 1] == "wikitext2"
  assert "--no-pack" in rows["ragged padded"] and "--pack" in rows["ragged packed"]
  for args in rows.values():
    parsed = benchmark.parse_args(args)
    assert parsed.length_distribution.name == "wikitext2"
  assert benchmark.parse_args(rows["ragged packed"]).pack is True
  for variant, message in (
      ({"name": "t", "kind": "trainer", "lengths": "wikitext2"}, "not a trainer row's"),
      ({"name": "l", "lengths": "wikitext9"}, "variant 'l': --lengths 'wikitext9'"),
      ({"name": "p", "pack": True}, "pack=True needs ragged rows"),
      ({"name": "q", "pack": "yes"}, "pack='yes' must be bool")):
    with pytest.raises(UserError, match=message) as e:
      ablate.check_spec({"base": {}, "variants": [variant]}, "spec")
    assert "\n" not in str(e.value)
  row = {"name": "ragged packed", "kind": "step", "status": "ok", "tokens_per_s": 1000.0,
         "mfu": 0.5, "real_tokens_per_s": 970.0, "step_time_s": 0.1}
  table = ablate.format_table("t", {}, [], [row])
  assert "| variant | kind | tokens/s | MFU | real tokens/s | step ms |" in table
  assert "| ragged packed | step | 1,000 | 0.500 | 970 | 100.0 |" in table
