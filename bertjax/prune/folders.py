"""A pruned model on disk: a converted-checkpoint folder (model.json, params/, tokenizer/).

model.json's "task" names the fine-tuning head params/ holds (kind, name, num_labels, labels:
`bertjax.convert.sources.TaskHead`). `init_from` reads the folder (the encoder and, when the
shapes match, that head), `bertjax.load` returns the model with its head (`.logits`), and
`python -m bertjax.convert to-hf` exports it as the matching transformers class (the config's
`pruned_heads` included).
"""

from __future__ import annotations

import json
import math
import pathlib
import shutil
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax.core import digests, paths
from bertjax.models.config import ModelConfig
from bertjax.runtime import checkpoints


def json_safe(value: Any) -> Any:
  """`value` with every non-finite float as None (JSON has no NaN: a pruned head's score)."""
  if isinstance(value, dict):
    return {k: json_safe(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [json_safe(v) for v in value]
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def save_pruned(path: str | pathlib.Path, cfg: ModelConfig, params: Any,
                tokenizer: str | pathlib.Path | None, info: dict | None = None,
                task: dict | None = None) -> pathlib.Path:
  """Writes `params` ({"encoder": ..., task head}) and `cfg` into a new folder `path`; `task`
  describes the task head (`Session.task_head`), None when params holds the encoder alone."""
  path = pathlib.Path(path).absolute()
  tmp = path.with_name(path.name + ".tmp")
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir(parents=True)
  host = jax.tree.map(np.asarray, jax.device_get(params))
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp / "params", host)
  checkpointer.wait_until_finished()
  digests.write(paths.as_path(tmp / "params"))  # checked by every reader (restore_params_folder)
  if task is not None and task["name"] not in params:
    raise ValueError(f"params has no {task['name']} tree for the task head")
  meta = {"model": cfg.to_dict(), "heads": [], "missing": [], "pruning": json_safe(info or {})}
  if task is not None:
    meta["task"] = task
  paths.replace_text(tmp / "model.json", json.dumps(meta, indent=2, allow_nan=False) + "\n")
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
