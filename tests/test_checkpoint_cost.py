"""`benchmark --checkpoint_cost` saves and restores the train state a run checkpoints, timing the
digest apart (the times themselves are measurements: no speed thresholds here)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np

from bertjax.tools import benchmark

TINY = ["--preset", "bert-tiny", "--batch_size", "2", "--seq_len", "32"]


def test_checkpoint_cost_saves_the_whole_train_state_as_a_trained_run_has_it(capsys):
  result = benchmark.main(["--checkpoint_cost", *TINY, "--rounds", "2"])
  config = benchmark.build_config(benchmark.parse_args(TINY))
  _, _, _, run, state = benchmark.step_setup(config)
  # params and AdamW's two moments, each as large as the parameters: random moments (a trained
  # run's) keep orbax's compression from shrinking them to nothing, as it does zeros.
  floats = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)
               if np.issubdtype(x.dtype, np.floating))
  assert floats >= 3 * 4 * run.num_params
  assert 0.9 * floats <= result["checkpoint_bytes"] <= 1.2 * floats
  assert result["rounds"] == 2 and result["hidden_size"] == 128 and result["num_layers"] == 2
  for key in ("save_s", "digest_write_s", "restore_s", "digest_check_s"):
    assert result[key] > 0, key
  assert result["save_overhead"] == result["digest_write_s"] / result["save_s"]
  assert result["restore_overhead"] == result["digest_check_s"] / result["restore_s"]
  out = capsys.readouterr().out.strip().splitlines()
  assert out[0].startswith("checkpoint 0.") and "medians of 2 rounds" in out[0]
  assert json.loads(out[-1]) == result


def test_checkpoint_cost_runs_the_trainers_checks_first():
  """A setting the trainer refuses (a fused update LAMB cannot have) is one line, exit 2, before
  anything is built: the state measured is one a run could train."""
  run = subprocess.run([sys.executable, "-m", "bertjax.tools.benchmark", "--checkpoint_cost",
                        *TINY, "--override", "optimizer.name=lamb", "--override",
                        "optimizer.fused_update=True"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  lines = run.stderr.strip().splitlines()
  assert run.returncode == 2, run.stderr[-2000:]
  assert len(lines) == 1 and lines[0].startswith("error: optimizer.fused_update=True cannot group "
                                                 "optimizer.name='lamb'"), lines
