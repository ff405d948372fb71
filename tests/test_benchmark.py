"""The benchmark runs and counts FLOPs as the hand count says (no speed thresholds here)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from bertjax.core.errors import UserError
from bertjax.tools import benchmark
from bertjax.tools.benchmark import last_layer_rows, model_flops_per_token
from bertjax.models.presets import preset

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_flop_count_matches_hand_count():
  cfg = preset("bert-tiny")  # L=2, H=128, I=512, V=30522
  flops = model_flops_per_token(cfg, seq_len=16, num_predictions=4, pair_head=True)
  # Per layer: q, k, v, out (4 * 128 * 128) + MLP (2 * 128 * 512) weights; 6 FLOPs per weight.
  assert flops["encoder"] == 6 * 2 * (4 * 128 * 128 + 2 * 128 * 512)
  # Scores and weighted values: 12 * layers * seq * hidden.
  assert flops["attention"] == 12 * 2 * 16 * 128
  # MLM transform + tied decoder, only at 4 of 16 positions.
  assert flops["mlm_head"] == pytest.approx(6 * (128 * 128 + 128 * 30522) * 4 / 16)
  # Pooler + NSP classifier once per 16-token sequence.
  assert flops["pair_head"] == pytest.approx(6 * (128 * 128 + 2 * 128) / 16)
  assert flops["total"] == pytest.approx(2_359_296 + 49_152 + 5_884_800 + 6_240)


def test_gathered_last_layer_counts_only_its_rows():
  cfg = preset("bert-tiny")
  full = model_flops_per_token(cfg, seq_len=16, num_predictions=4, pair_head=True)
  part = model_flops_per_token(cfg, seq_len=16, num_predictions=4, pair_head=True,
                               last_layer_rows=5)
  # The last of 2 layers: k, v at all 16 rows; q, output and the MLP at 5 of them.
  last = 2 * 128 * 128 + (2 * 128 * 128 + 2 * 128 * 512) * 5 / 16
  assert part["encoder"] == pytest.approx(6 * ((4 * 128 * 128 + 2 * 128 * 512) + last))
  assert part["attention"] == 12 * 16 * 128 + 12 * 5 * 128
  assert part["mlm_head"] == full["mlm_head"] and part["pair_head"] == full["pair_head"]
  # The runner asks for P + 1 rows on MLM objectives, 3P + 1 for SpanBERT, every row for ELECTRA.
  from ml_collections import ConfigDict
  rows = lambda objective, **kw: last_layer_rows(cfg.replace(**kw), ConfigDict(
      {"objective": objective, "max_predictions_per_seq": 20, "max_seq_length": 128}))
  assert (rows("mlm_nsp"), rows("mlm"), rows("span_sbo"), rows("rtd")) == (21, 21, 61, None)
  assert rows("mlm_nsp", gather_last_layer=False) is None and rows("mlm", scan_layers=True) is None


def test_albert_counts_its_projection_and_shared_layers_once_per_use():
  cfg = preset("albert-base")
  flops = model_flops_per_token(cfg, seq_len=128, num_predictions=20, pair_head=True)
  # Shared layers still cost FLOPs at every one of the 12 uses; E->H projection counted.
  per_layer = 4 * 768 * 768 + 2 * 768 * 3072
  assert flops["encoder"] == 6 * (12 * per_layer + 128 * 768)


def test_modernbert_counts_geglu_and_the_local_window():
  cfg = preset("modernbert-tiny")  # L=3 (layer 0 global, 1 and 2 local), H=128, I=192, window 16
  flops = model_flops_per_token(cfg, seq_len=64, num_predictions=10, pair_head=False)
  # GeGLU: Wi's two H x I halves and Wo's I x H, at every row of every layer (no gathering).
  assert flops["encoder"] == 6 * 3 * (4 * 128 * 128 + 3 * 128 * 192)
  # The global layer's queries see 64 keys, the local layers' 16 + 1.
  assert flops["attention"] == 12 * 128 * (64 + 17 + 17)
  assert flops["mlm_head"] == pytest.approx(6 * (128 * 128 + 128 * 50368) * 10 / 64)
  assert flops["pair_head"] == 0
  from ml_collections import ConfigDict
  assert last_layer_rows(cfg, ConfigDict({"objective": "mlm", "max_predictions_per_seq": 10,
                                          "max_seq_length": 64})) is None


@pytest.mark.slow
def test_modernbert_preset_compares_with_modernbert_for_masked_lm():
  """`--preset modernbert-tiny --compare hf-torch`: MLM on both sides, transformers'
  ModernBertForMaskedLM as the reference, FLOPs as counted above."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-m", "bertjax.tools.benchmark", "--preset",
                      "modernbert-tiny", "--batch_size", "2", "--seq_len", "64", "--steps", "1",
                      "--override", "max_predictions_per_seq=10", "--compare", "hf-torch"],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads(r.stdout.strip().splitlines()[-1])
  assert result["objective"] == "mlm" and result["reference"]["model"] == "ModernBertForMaskedLM"
  assert result["reference"]["tokens_per_s"] > 0 and result["tokens_per_s"] > 0
  assert result["model_flops_per_token"] == pytest.approx(
      model_flops_per_token(preset("modernbert-tiny"), 64, 10, pair_head=False)["total"])


@pytest.mark.slow
def test_benchmark_cli_reports_json_and_compares(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-m", "bertjax.tools.benchmark", "--preset", "bert-tiny",
                      "--batch_size", "2", "--seq_len", "16", "--steps", "2",
                      "--override", "max_predictions_per_seq=4", "--compare", "hf-torch"],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads(r.stdout.strip().splitlines()[-1])
  assert result["tokens_per_s"] > 0 and result["reference"]["tokens_per_s"] > 0
  assert result["speedup_vs_reference"] == pytest.approx(
      result["tokens_per_s"] / result["reference"]["tokens_per_s"])
  # MLM + NSP: the last layer at the 4 masked rows and [CLS] (model.gather_last_layer).
  assert result["model_flops_per_token"] == pytest.approx(
      model_flops_per_token(preset("bert-tiny"), 16, 4, last_layer_rows=5)["total"])
  assert 0 < result["mfu"] < 1
  assert result["compile_time_s"] > 0 and result["peak_memory_bytes"] > 0
  assert 0 < result["xla_temp_bytes"] < result["peak_memory_bytes"]


@pytest.mark.slow
def test_benchmark_rounds_alternate_and_report_the_median():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-m", "bertjax.tools.benchmark", "--preset", "bert-tiny",
                      "--batch_size", "2", "--seq_len", "16", "--steps", "2",
                      "--override", "max_predictions_per_seq=4", "--compare", "hf-torch",
                      "--rounds", "2"],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads(r.stdout.strip().splitlines()[-1])
  rounds = result["rounds"]
  assert len(rounds) == 2 and r.stdout.count("round ") == 2
  for x in rounds:
    assert x["speedup"] == pytest.approx(x["tokens_per_s"] / x["reference_tokens_per_s"])
    assert x["peak_memory_bytes"] > 0 and x["reference_peak_memory_bytes"] > 0
  assert result["speedup_vs_reference"] == pytest.approx(
      (rounds[0]["speedup"] + rounds[1]["speedup"]) / 2)
  assert result["speedup_range"] == [min(x["speedup"] for x in rounds),
                                     max(x["speedup"] for x in rounds)]


def test_rounds_without_compare_is_a_clear_error():
  r = subprocess.run([sys.executable, "-m", "bertjax.tools.benchmark", "--preset", "bert-tiny",
                      "--rounds", "2"], cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                     capture_output=True, text=True, timeout=300)
  assert r.returncode != 0 and "Traceback" not in r.stderr
  assert "--rounds needs --compare hf-torch or hf-torch-compile" in r.stderr


@pytest.mark.slow
def test_profile_writes_a_table_of_operations_and_compile_reference_runs(tmp_path):
  """--profile DIR on a CPU: ops.md and ops.json name the step's operations with their count per
  step, time and share; --compare hf-torch-compile times transformers under torch.compile."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-m", "bertjax.tools.benchmark", "--preset", "bert-tiny",
                      "--batch_size", "2", "--seq_len", "16", "--steps", "2",
                      "--override", "max_predictions_per_seq=4", "--profile", str(tmp_path / "prof"),
                      "--compare", "hf-torch-compile"],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads(r.stdout.strip().splitlines()[-1])
  table = json.loads((tmp_path / "prof" / "ops.json").read_text())
  ops = table["ops"]
  assert len(ops) >= 10 and table["step_device_ms"] > 0
  assert sum(o["share"] for o in ops) == pytest.approx(1.0, abs=1e-6)
  assert sum(o["ms_per_step"] for o in ops) == pytest.approx(table["step_device_ms"], rel=1e-6)
  assert all(o["per_step"] > 0 for o in ops)
  assert [o["ms_per_step"] for o in ops[:-1]] == sorted((o["ms_per_step"] for o in ops[:-1]),
                                                       reverse=True)
  md = (tmp_path / "prof" / "ops.md").read_text()
  assert "| operation | per step | ms per step | share |" in md and ops[0]["name"][:40] in md
  assert result["profile"]["step_device_ms"] == pytest.approx(table["step_device_ms"])
  ref = result["reference"]
  assert ref["framework"] == "hf-torch-compile" and ref["tokens_per_s"] > 0
  assert ref["first_step_s"] > ref["step_time_s"]  # the first step compiled


def _write_trace(path, threads, events):
  import gzip
  meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
          {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}}]
  meta += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
           for (pid, tid), name in threads.items()]
  path.mkdir(parents=True)
  with gzip.open(path / "perfetto_trace.json.gz", "wt") as f:
    json.dump({"traceEvents": meta + events}, f)


@pytest.mark.parametrize("lines", ["tpu", "gpu"])
def test_profile_table_counts_each_device_operation_once(tmp_path, lines):
  """Device traces also carry lines that summarize the operations (modules, steps); only the
  operations themselves are counted: the "XLA Ops" line where there is one, else the streams."""
  from bertjax.runtime.profiling import op_table
  x = lambda tid, name, dur, pid=1: {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": 0,
                                     "dur": dur}
  if lines == "tpu":
    threads = {(1, 1): "Steps", (1, 2): "XLA Modules", (1, 3): "XLA Ops", (2, 9): "python"}
    events = [x(1, "0", 100.0), x(2, "jit_train_step", 90.0), x(3, "fusion.1", 60.0),
              x(3, "convolution.2", 30.0), x(9, "PjitFunction", 500.0, pid=2)]
  else:
    threads = {(1, 1): "XLA Modules", (1, 2): "Stream #20(Compute)", (1, 3): "Stream #21(MemcpyH2D)"}
    events = [x(1, "jit_train_step", 90.0), x(2, "fusion.1", 60.0), x(3, "memcpy", 30.0)]
  _write_trace(tmp_path / "t", threads, events)
  table = op_table(tmp_path / "t", steps=1)
  assert table["where"] == "device"
  assert table["step_device_ms"] == pytest.approx(0.09)
  assert {o["name"] for o in table["ops"]} == ({"fusion.1", "convolution.2"} if lines == "tpu"
                                              else {"fusion.1", "memcpy"})


@pytest.mark.slow
def test_compile_only_reports_the_plan_and_refuses_timing_flags():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  base = [sys.executable, "-m", "bertjax.tools.benchmark", "--preset", "bert-tiny", "--batch_size",
          "2", "--seq_len", "16", "--override", "max_predictions_per_seq=4", "--steps", "0"]
  r = subprocess.run(base + ["--remat", "dots"], cwd=REPO, env=env, capture_output=True, text=True,
                     timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads(r.stdout.strip().splitlines()[-1])
  assert result["xla_temp_bytes"] > 0 and result["compile_time_s"] > 0 and result["remat"] == "dots"
  assert "tokens_per_s" not in result
  r = subprocess.run(base + ["--compare", "hf-torch"], cwd=REPO, env=env, capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 2 and "Traceback" not in r.stderr
  assert "--steps 0 compiles the step without running it" in r.stderr


def test_a_loaded_host_is_warned_of_with_the_figures(monkeypatch, capsys):
  """A 1-minute load average above half the cores, read before the benchmark starts (injected
  here), prints one warning line after the figures; at half or below, none. A refusal stays
  its one line. Costs one compile of bert-tiny (--steps 0)."""
  assert benchmark.load_warning(1.0, 2) == ""
  assert benchmark.load_warning(1.01, 2) == (
      "warning: the host's load average was 1.01 on 2 cores (above half of them) when the "
      "benchmark started: other work shares this machine, so these figures mean little; time "
      "on an idle host")
  monkeypatch.setattr(os, "getloadavg", lambda: (3.5, 3.0, 2.0))
  monkeypatch.setattr(os, "cpu_count", lambda: 4)
  args = ["--preset", "bert-tiny", "--batch_size", "2", "--seq_len", "16", "--override",
          "max_predictions_per_seq=4", "--steps", "0"]
  with pytest.raises(UserError, match="--steps 0 compiles the step without running it"):
    benchmark.main(args + ["--compare", "hf-torch"])
  assert "warning" not in capsys.readouterr().err
  result = benchmark.main(args)
  err = capsys.readouterr().err
  assert result["compile_time_s"] > 0
  assert err.count("warning: the host's load average was 3.50 on 4 cores") == 1, err
  assert err.rstrip().endswith("time on an idle host"), err  # after everything else
