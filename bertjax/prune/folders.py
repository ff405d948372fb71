"""A pruned model on disk: a converted-checkpoint folder (model.json, params/, tokenizer/).

`init_from` reads it (the encoder and, when the shapes match, a task head such as the
classifier), `bertjax.load` returns its encoder, and `python -m bertjax.convert to-hf` exports
it (the config's `pruned_heads` included).
"""

from __future__ import annotations

import json
import pathlib
import shutil
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax import checkpoints, paths
from bertjax.models.config import ModelConfig


def save_pruned(path: str | pathlib.Path, cfg: ModelConfig, params: Any,
                tokenizer: str | pathlib.Path | None, info: dict | None = None) -> pathlib.Path:
  """Writes `params` ({"encoder": ..., task heads...}) and `cfg` into a new folder `path`."""
  path = pathlib.Path(path).absolute()
  tmp = path.with_name(path.name + ".tmp")
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir(parents=True)
  host = jax.tree.map(np.asarray, jax.device_get(params))
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp / "params", host)
  checkpointer.wait_until_finished()
  meta = {"model": cfg.to_dict(), "heads": [], "missing": [], "pruning": info or {}}
  paths.replace_text(tmp / "model.json", json.dumps(meta, indent=2) + "\n")
  if tokenizer is not None and pathlib.Path(tokenizer).is_dir():
    shutil.copytree(tokenizer, tmp / "tokenizer")
  if path.exists():
    shutil.rmtree(path)
  tmp.rename(path)
  return path


def load_pruned(path: str | pathlib.Path) -> tuple[ModelConfig, Any]:
  """(config, params) of a folder `save_pruned` wrote (or any converted folder / workdir)."""
  fields = checkpoints.load_model_config(path)
  cfg = ModelConfig.from_dict({**fields, "kernels": "auto"})
  return cfg, checkpoints.restore_params(path)
