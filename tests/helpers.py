"""Helpers the tests share: tiny model settings, config loading, subprocess runs, and what only
tests ask of the models (a dropout form's applied rate, the attention-dropout path of a config)."""

import difflib
import os
import pathlib
import shutil
import subprocess
import sys

from bertjax.config import config_lib
from bertjax.models import dropout, kernels

REPO = pathlib.Path(__file__).resolve().parent.parent
TINY = {"model.hidden_size": 32, "model.intermediate_size": 64, "model.num_attention_heads": 2,
        "model.num_hidden_layers": 2, "tensorboard": False, "async_checkpointing": False,
        "checkpoint_every": 100000}


def glue_data(root: pathlib.Path, data_dir: pathlib.Path, task: str = "RTE") -> pathlib.Path:
  """A GLUE data folder under `root` holding `task`'s train and dev files (links to the shared
  data): what --config.data_dir takes."""
  folder = root / "glue" / task
  folder.mkdir(parents=True)
  for name in ("train.tsv", "dev.tsv"):
    (folder / name).symlink_to(data_dir / "glue" / task / name)
  return folder.parent


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


def package_with(root: pathlib.Path, module: str, source: str, after_key: str,
                 line: str) -> pathlib.Path:
  """A copy of bertjax/, configs/ and launch.py under `root` with `source` written as `module`
  (a path under bertjax/) and `line` added to the registry after the entry of `after_key`; it
  checks that the registry changed by exactly that one added line. Returns `root`."""
  for part in ("bertjax", "configs"):
    shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
  shutil.copy(REPO / "launch.py", root / "launch.py")
  (root / "bertjax" / module).write_text(source)
  registry = root / "bertjax" / "registry.py"
  before = registry.read_text()
  anchor = next(l for l in before.splitlines(keepends=True) if l.startswith(f'    "{after_key}":'))
  after = before.replace(anchor, anchor + f"    {line}\n")
  registry.write_text(after)
  changed = [l for l in difflib.ndiff(before.splitlines(), after.splitlines())
             if l[:2] in ("+ ", "- ")]
  assert len(changed) == 1 and changed[0].startswith("+ ")
  return root


def effective_rate(rate: float, bits: int = 32) -> float:
  """The drop probability a dropout form applies for a configured `rate` with `bits`-bit draws."""
  return dropout.threshold(rate, bits) / 2 ** bits


def attention_dropout_for(cfg) -> str:
  """"explicit" or "pallas": the path of `cfg`'s training steps with attention dropout, traced
  here (under the mesh in context)."""
  return kernels.attention_dropout_path(kernels.attention_dropout_setting(cfg,
                                                                          kernels.for_model(cfg)))
