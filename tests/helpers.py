"""Helpers the fine-tuning tests share: tiny model settings, config loading, subprocess runs."""

import os
import pathlib
import subprocess
import sys

from bertjax.config import config_lib

REPO = pathlib.Path(__file__).resolve().parent.parent
TINY = {"model.hidden_size": 32, "model.intermediate_size": 64, "model.num_attention_heads": 2,
        "model.num_hidden_layers": 2, "tensorboard": False, "async_checkpointing": False,
        "checkpoint_every": 100000}


def load_config(spec: str, **settings):
  """`configs/<file>.py[:variant]` (relative to the repo) with `key=value` overrides applied."""
  config = config_lib.load_config_file(str(REPO / spec))
  config_lib.apply_overrides(config, [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                                      for k, v in settings.items()])
  return config


def run_module(*args, timeout=300):
  """Runs `python ARGS...` in the repo, as a user would, and returns the completed process."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=timeout)
