"""Helpers the tests share: tiny model settings, config loading, subprocess runs, and what only
tests ask of the models (a dropout form's applied rate, the attention-dropout path of a config)."""

import difflib
import os
import pathlib
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np

from bertjax.config import config_lib
from bertjax.data import instances
from bertjax.metrics import ner as ner_eval
from bertjax.models import dropout, kernels
from bertjax.runtime import optim, sharding
from bertjax.trainer import train as trainer

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


def epoch_instances(documents, kind: str, max_seq_length: int, seed: int, epoch: int,
                    shard_index: int = 0, shard_count: int = 1, *, special,
                    short_seq_prob: float | None = None, stats=None):
  """All instances of one epoch of one shard (`instances.walk_epoch` without its cursors);
  `stats` is filled as it goes."""
  for instance, _ in instances.walk_epoch(documents, kind, max_seq_length, seed, epoch,
                                          shard_index, shard_count, short_seq_prob=short_seq_prob,
                                          special=special, stats=stats):
    yield instance


def count_instances(documents, kind: str, max_seq_length: int, seed: int = 0, epoch: int = 0,
                    shard_index: int = 0, shard_count: int = 1, *, special,
                    short_seq_prob: float | None = None) -> instances.InstanceStats:
  """Walks one epoch: how many documents are usable and how many instances they give."""
  stats = instances.InstanceStats()
  for _ in epoch_instances(documents, kind, max_seq_length, seed, epoch, shard_index, shard_count,
                           special=special, short_seq_prob=short_seq_prob, stats=stats):
    pass
  return stats


def bertjax_losses(objective, config, model_cfg, params, batches) -> list[float]:
  """bertjax's side: the trainer's state, optimizer and jitted train step (one device), started
  from `params` (numpy, the objective's tree) and run one step per batch; the per-step losses
  (the other side of bertjax/tools/hf_reference.py's torch loop, for the parity tests)."""
  model = objective.make_model(config, model_cfg)
  init_batch = objective.init_batch(config, 1, config.max_seq_length, config.max_predictions_per_seq)
  abstract = nn.meta.unbox(trainer.abstract_params_of(objective, model, init_batch))
  if jax.tree.structure(abstract) != jax.tree.structure(params):
    raise ValueError(f"params do not fit {type(model).__name__}: "
                     f"{jax.tree.structure(params)} vs {jax.tree.structure(abstract)}")
  optimizer = optim.make_optimizer(config, params=abstract, num_layers=model_cfg.num_hidden_layers,
                                   scalar_clipping=kernels.for_model(model_cfg).scalar_clipping)
  mesh = sharding.make_mesh((1, 1, 1))
  state, _, _ = trainer.create_train_state(objective, model, optimizer, config, mesh, init_batch,
                                             rules=sharding.rules_from_config(config))
  params = jax.tree.map(lambda a, x: np.asarray(x, a.dtype), abstract, params)
  state = state.replace(params=params, opt_state=optimizer.init(params))
  losses = []
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.rules_from_config(config)):
    step_fn = jax.jit(trainer.make_train_step(objective, model, optimizer, accum=1))
    for batch in batches:
      state, metrics = step_fn(state, batch)
      losses.append(float(metrics["loss"][0]))
  return losses


def conll_part(src: pathlib.Path, dst: pathlib.Path, first: int, count: int) -> pathlib.Path:
  """Sentences [first, first + count) of a CoNLL file, written in its own format to `dst`."""
  sentences = ner_eval.read_conll(src)[first:first + count]
  with open(dst, "w", encoding="utf-8") as f:
    f.write("-DOCSTART- -X- -X- O\n\n")
    for s in sentences:
      for row in zip(s.tokens, s.pos, s.chunk, s.tags):
        f.write(" ".join(row) + "\n")
      f.write("\n")
  return dst
