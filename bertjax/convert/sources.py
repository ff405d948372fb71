"""What a folder to export holds: any bertjax workdir read into one `Source`.

Four kinds of folder:
  converted    model.json + params/ (+ tokenizer/), written by `from-hf`
  pretraining  config.json + checkpoints/<step>/ of a pretraining run (mlm_nsp, mlm, mlm_sop,
               span_sbo, rtd)
  fine-tuning  config.json + checkpoints/<step>/ of a glue, squad or ner run
  best         WORKDIR/best/ (params/ + best.json) kept by a fine-tuning run with best_metric;
               its config.json and tokenizer/ are the run's, one folder up

A `Source` also says which parts were never trained: heads (and a pooler) that `from-hf`
initialized fresh (model.json "missing"), and a pooler that a pretraining objective without a
pair head never trained.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import jax
import numpy as np

from bertjax.convert.models import check_tree
from bertjax.convert.readers import one_line
from bertjax.convert.workdirs import Converted, load_workdir, to_numpy
from bertjax.core import paths, run_files
from bertjax.core.errors import UserError, fail
from bertjax.metrics import glue
from bertjax.models.config import ModelConfig
from bertjax.models.electra import generator_config
from bertjax.runtime import checkpoints
from bertjax.tasks.ner import LABELS as TAGGING_LABELS

PathLike = str | os.PathLike

PRETRAINING = ("mlm_nsp", "mlm", "mlm_sop", "span_sbo", "rtd")
TASKS = ("glue", "squad", "ner")
# Heads of our pretraining trees that no transformers class holds.
NO_HF_HEAD = {"sbo": "no transformers class holds SpanBERT's span boundary head"}


@dataclasses.dataclass
class TaskHead:
  """A fine-tuning head: `kind` "sequence" (GLUE), "token" (NER/POS) or "qa" (SQuAD start/end),
  stored under params[`name`]; `labels` names the outputs when known."""
  kind: str
  name: str
  num_labels: int
  labels: tuple[str, ...] | None = None
  regression: bool = False
  task: str = ""
  # What the head reads (`head.*` of the run's config; see bertjax.models.features).
  features: str = "standard"
  layers: tuple[int, ...] = (-4, -3, -2, -1)
  pooling: str = "cls"


@dataclasses.dataclass
class Source:
  """A model to export or load: the converted tree, its task head, what was never trained.

  converted.params holds {"encoder", *pretraining heads} plus the task head's tree;
  converted.heads lists the pretraining heads (mlm, pair, rtd) only. `untrained` names parts
  never trained ("mlm", "pair", "rtd", "pooler"); `left_out` maps parts no export can hold to
  the reason.
  """
  converted: Converted
  kind: str
  task: TaskHead | None = None
  untrained: tuple[str, ...] = ()
  left_out: dict[str, str] = dataclasses.field(default_factory=dict)
  tokenizer: pathlib.Path | None = None  # a local folder (a remote one's local copy)
  step: int | None = None
  path: paths.Path = paths.Path(".")
  objective: str = ""


def read_source(path: PathLike, step: int | None = None) -> Source:
  """Reads a converted folder, a training workdir or a best/ folder (see the module doc), local or
  remote (gs://...: the arrays are read from there, the tokenizer from a local copy)."""
  d = paths.absolute(path)
  if not d.is_dir():
    what = "is a file, not a folder" if d.exists() else "does not exist"
    fail(f"{d} {what}; pass a training workdir, its best/ folder or a folder written by "
         "`python -m bertjax.convert from-hf`")
  if (d / "model.json").is_file():
    _no_step(step, d, "a converted folder")
    c = load_workdir(d)
    source = Source(c, "converted", untrained=tuple(c.missing), step=None, path=d,
                    tokenizer=_tokenizer(d))
    if c.task is not None:
      source.task = _recorded_task(c, d)
      source.objective = source.task.task.split("/")[0]
    for name in c.unnamed:
      source.left_out[name] = ("model.json does not name this head (a folder written before "
                               "heads were recorded); prune the run again to keep it")
    return source
  if (best := checkpoints.best_params(d)) is not None:
    _no_step(step, d, "a best/ folder")
    config = _read_config(d.parent)
    params = _restore(best)
    return _from_training(config, params, "best", _best_step(d), d, d.parent)
  if (d / "config.json").is_file() and (d / "checkpoints").is_dir():
    config = _read_config(d)
    found, params = checkpoints.restore_checkpoint_params(d, step)
    return _from_training(config, to_numpy(params), "training", found, d, d)
  fail(f"{d} is not a bertjax model folder: it has no model.json (from-hf), config.json + "
       "checkpoints/ (a training workdir) or best.json + params/ (a best/ folder)")


def _tokenizer(run: paths.Path) -> pathlib.Path | None:
  """The run's tokenizer/ as a local folder, None when it has none."""
  tok = run / "tokenizer"
  return paths.reading(tok) if tok.is_dir() else None


def _no_step(step: int | None, d: paths.Path, what: str) -> None:
  if step is not None:
    fail(f"--step applies to training workdirs; {d} is {what}: drop --step")


def _read_config(d: paths.Path) -> dict[str, Any]:
  path = d / "config.json"
  if not path.is_file():
    fail(f"{path} not found; a best/ folder is read inside the workdir of its run")
  try:
    config = json.loads(path.read_text(encoding="utf-8"))
    ModelConfig.from_dict({**config["model"], "kernels": "auto"})
  except (ValueError, KeyError, TypeError) as e:
    fail(f"cannot read {path} ({one_line(e)}); it may be truncated: copy it again from where "
         "the run was made")
  except UserError as e:  # a setting of the wrong type or value: name the file it came from
    fail(f"{path}: {e}")
  return config


def _restore(path: paths.Path) -> dict[str, Any]:
  try:
    return to_numpy(checkpoints.restore_params(path.parent))
  except UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    fail(f"cannot restore {path}: {one_line(e)}; the folder is damaged")


def _best_step(d: paths.Path) -> int | None:
  step = run_files.read_number(d / "best.json", "step")  # damaged: None, with a warning
  return int(step) if step is not None else None


def _recorded_task(c: Converted, d: paths.Path) -> TaskHead:
  """model.json's "task" (see `task_head`), checked against the head's tree."""
  try:
    t = dict(c.task)
    t["labels"] = tuple(t["labels"]) if t.get("labels") is not None else None
    t["layers"] = tuple(t.get("layers", (-4, -3, -2, -1)))
    task = TaskHead(**t)
  except (TypeError, ValueError) as e:
    fail(f"cannot read the task head in {d / 'model.json'} ({one_line(e)}); write it again")
  # The output layer: the last kernel, or the one named classifier (ModernBERT's head has a dense
  # transform before it).
  kernels = [np.shape(v) for k, v in jax.tree_util.tree_leaves_with_path(c.params[task.name])
             if jax.tree_util.keystr(k).endswith("['kernel']")]
  named = c.params[task.name].get("classifier", {})
  if isinstance(named, dict) and "kernel" in named:
    kernels.append(np.shape(named["kernel"]))
  if not kernels or kernels[-1][-1] != task.num_labels:
    fail(f"{d / 'params'}: the {task.name} head does not output the {task.num_labels} labels "
         "model.json names; write the folder again")
  return task


def task_head(config: dict[str, Any], params: dict[str, Any]) -> TaskHead:
  """The fine-tuning head of a run with resolved `config` (config.json) and `params`."""
  objective = config["objective"]
  head = config.get("head") or {}
  reads = {"features": head.get("features", "standard"),
           "layers": tuple(head.get("layers", (-4, -3, -2, -1))),
           "pooling": head.get("pooling", "cls")}
  if objective == "squad":
    return TaskHead("qa", "qa_outputs", 2, ("start", "end"), task="squad", **reads)
  kernel = np.shape(params["classifier"]["classifier"]["kernel"])
  if objective == "ner":
    task = config.get("task", "ner")
    return TaskHead("token", "classifier", kernel[1], TAGGING_LABELS.get(task), task=task,
                    **reads)
  t = glue.get_task(config.get("task", ""))
  labels = t.label_names if len(t.label_names) == kernel[1] else None
  return TaskHead("sequence", "classifier", kernel[1], labels, t.is_regression, f"glue/{t.name}",
                  **reads)


def _from_training(config: dict[str, Any], params: dict[str, Any], kind: str, step: int | None,
                   d: paths.Path, run: paths.Path) -> Source:
  objective = config.get("objective")
  cfg = ModelConfig.from_dict({**config["model"], "kernels": "auto"})
  source = Source(Converted(cfg, params, (), hf_model_type=cfg.architecture), kind, step=step,
                  path=d, tokenizer=_tokenizer(run), objective=objective)
  if objective in TASKS:
    source.task = task_head(config, params)
    source.kind = "fine-tuning" if kind == "training" else kind
    where = f"{d} [{objective} model]"
    # The task model's tree: encoder + its head, checked like a converted one.
    check_tree({"encoder": params["encoder"]}, cfg, (), where, str(run / "config.json"))
    extra = sorted(set(params) - {"encoder", source.task.name, "scalar_mix"})
    if extra:
      fail(f"{where}: unexpected parameters {', '.join(extra)}; is this a bertjax run?")
    return source
  if objective not in PRETRAINING:
    fail(f"{d} was trained with objective {objective!r}; export supports the pretraining "
         f"objectives {', '.join(PRETRAINING)} and the tasks {', '.join(TASKS)}")
  source.kind = "pretraining" if kind == "training" else kind
  heads = tuple(h for h in ("mlm", "pair", "rtd") if h in params)
  for name, reason in NO_HF_HEAD.items():
    if name in params:
      source.left_out[name] = reason
      params.pop(name)
  generator = params.pop("generator", None)
  source.converted.heads = heads
  if cfg.use_pooler and "pair" not in heads:
    source.untrained = ("pooler",)  # no loss of this objective reads it
  check_tree(params, cfg, heads, str(d), str(run / "config.json"))
  if generator is not None:
    source.converted.generator = _generator(config, cfg, params, generator, d, run)
    source.converted.part = "both"
  return source


def _generator(config: dict[str, Any], cfg: ModelConfig, params: dict[str, Any],
               generator: dict[str, Any], d: paths.Path, run: paths.Path) -> Converted:
  """ELECTRA's generator as a model of its own: its encoder reads the discriminator's
  embeddings in training, so the exported generator gets a copy of them."""
  e = config.get("electra", {})
  gen_cfg = generator_config(cfg, e.get("generator_hidden_fraction", 0.25),
                             e.get("generator_layer_fraction", 1.0))
  tree = {"encoder": {**generator["encoder"], "embeddings": params["encoder"]["embeddings"]},
          "mlm": generator["mlm"]}
  check_tree(tree, gen_cfg, ("mlm",), str(d) + " [generator]", str(run / "config.json"))
  return Converted(gen_cfg, tree, ("mlm",), hf_model_type="electra", part="generator")
