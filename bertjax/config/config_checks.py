"""Settings checked before a run prepares, trains or writes anything; each failure is one line.

The one validator of settings. A run's plan (bertjax/trainer/run_plan.py `plan`) enters it once,
through `check`, before anything is created, and the modules below trust what the plan hands
them. `check` runs, in order:
  `check_settings`  the config alone (every numeric setting's range), the workdir and init_from
                    paths: before the objective, the mesh or the workdir exist;
  the objective's own `check(config)`;
  `check_init_from_model`  init_from's architecture against the run's, and every
                    `--config.model.*` given against init_from's model where that is what trains;
  `check_process_rows`  the mesh made of the devices gives each process its block of the batch;
  `check_run`       the mesh and the model actually trained (fine-tuning takes init_from's
                    architecture): the batch against the data-parallel size and accumulation,
                    the evaluation batch, mesh axes against heads and hidden sizes,
                    max_seq_length against the position table;
  `check_objective` what the objective asks of the pretraining data (a source, masking, row
                    length, packing); before the workdir is made, a tokenizer trained or a corpus
                    prepared;
and returns what it checked (`Checked`: the mesh, the logical rules, the model trained,
accumulation, the evaluation batch size). Two checks need what only comes later:
  `check_data`      the built inputs: the tokenizer against the model's vocabulary and against
                    the one init_from was trained with; before anything is initialized or written;
  `check_param_shardings`  the last word on the layout, parameter by parameter.
A sweep runs `check_config` (the ranges, the model's fields, its positions) on every point
before the first runs. Every message names `setting=value`, what it must be and the fix
(`errors.fail`: exit status 2, one line).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import pathlib
from typing import Any, Sequence

import jax

from bertjax.config import config_lib, config_rules, settings
from bertjax.core import paths, run_files
from bertjax.runtime import checkpoints, optim, sharding
# The table of allowed values (bertjax/config/config_rules.py); its names are also read from here.
from bertjax.config.config_rules import (AT_LEAST_1, CHOICES, NON_NEGATIVE, OPEN_UNIT, POSITIVE,
                                         PROBABILITY, RULES, Range, SHARE, UNIT)
from bertjax.core.errors import fail
from bertjax.data import batch_warmup, instances, masking, packing, tokenizers
from bertjax.models import features
from bertjax.models.config import RUN_FIELDS, ModelConfig
from bertjax.models.modernbert import refuse_pair_head

_MISSING = object()


def _get(config, key: str):
  node = config
  for part in key.split("."):
    if not hasattr(node, "keys") or part not in node.keys():
      return _MISSING
    node = node[part]
  return node


def check_ranges(config) -> None:
  """Every declared setting within its range or choices (bertjax/config/settings.py, as config_rules
  reads it), and the ones that depend on each other."""
  for key, allowed, meaning, example in config_rules.rules():
    value = _get(config, key)
    if value is not _MISSING and not allowed.holds(value):
      fail(f"{key}={value!r} must be {allowed} ({meaning}); fix: --config.{key}={example!r}")
  for key, choices in config_rules.choices():
    value = _get(config, key)
    if value is not _MISSING and value not in choices:
      named = ", ".join(c or "''" for c in choices)
      fail(f"{key}={value!r} must be one of {named}; fix: --config.{key}={choices[0] or repr('')}")
  masking.check_rate_schedule(config.get("masking", {}).get("rate_schedule", ()))
  model = config.model
  if model.pad_token_id >= model.vocab_size:
    fail(f"model.pad_token_id={model.pad_token_id} must be below model.vocab_size="
         f"{model.vocab_size}; fix: --config.model.pad_token_id=0")
  query = _get(config, "max_query_length")  # SQuAD: [CLS] question [SEP] passage [SEP]
  if query is not _MISSING and config.max_seq_length - query - 3 < 8:
    fail(f"max_seq_length={config.max_seq_length} leaves fewer than 8 passage tokens after a "
         f"{query}-token question (max_query_length); fix: --config.max_seq_length="
         f"{query + 3 + 8} or a smaller --config.max_query_length")
  epochs = _get(config, "num_epochs")
  if config.total_steps == 0 and epochs is not _MISSING and epochs <= 0:
    fail("total_steps=0 derives the steps from num_epochs, which is not positive; fix: "
         "--config.num_epochs=3 or --config.total_steps=1000")
  best = config.get("best_metric", "")  # best_mode's default, max, would keep the worst loss
  if best and config.get("best_mode", "max") == "max" and run_files.lower_is_better(best):
    fail(f"best_metric={best!r} is best at its lowest, but best_mode='max' keeps its highest; "
         "fix: --config.best_mode=min")
  check_evals(config)


# The evaluators `config.evals` may name: bertjax/evaluators/__init__.py's REGISTERED keys (that
# package sits above this one; tests/test_evaluators.py keeps the two equal).
EVALUATORS = ("metric_sums", "glue", "squad", "ner", "glue_probe")


def check_evals(config) -> None:
  """Every `config.evals` entry (absent: the objective's own evaluation) is a dict naming an
  evaluator, run every positive number of steps."""
  for i, entry in enumerate(config.get("evals", None) or ()):
    if not hasattr(entry, "get"):
      fail(f"evals[{i}]={entry!r} is not a dict; fix: dict(name=\"metric_sums\", every=1000)")
    name, every = entry.get("name"), entry.get("every")
    if name not in EVALUATORS:
      fail(f"evals[{i}].name={name!r} is not an evaluator; fix: one of {', '.join(EVALUATORS)}")
    if isinstance(every, bool) or not isinstance(every, int) or every <= 0:
      fail(f"evals[{i}].every={every!r} must be a positive number of steps between its runs; "
           f"fix: evals[{i}].every=1000")
    if not isinstance(entry.get("prefix", ""), str):
      fail(f"evals[{i}].prefix={entry.get('prefix')!r} must be a string; fix: "
           f"evals[{i}].prefix=\"{name}/\"")


def check_workdir(workdir) -> None:
  """The workdir is a folder, or can be made one (no file in the way, a writable parent); a
  remote one (gs://...) is reachable and not a file."""
  if paths.is_remote(workdir):
    _check_remote_workdir(workdir)
    return
  path = pathlib.Path(workdir)
  if path.exists():
    if not path.is_dir():
      fail(f"workdir {path} is a file, not a folder; fix: pass a folder to --workdir (new, or a "
           "run's workdir to resume it)")
    if not os.access(path, os.W_OK | os.X_OK):
      fail(f"workdir {path} is not writable; fix: pass a folder you can write to --workdir")
    return
  for parent in path.absolute().parents:
    if parent.exists():
      if not parent.is_dir():
        fail(f"workdir {path} cannot be created: {parent} is a file; fix: pass a --workdir "
             "under a folder")
      if not os.access(parent, os.W_OK | os.X_OK):
        fail(f"workdir {path} cannot be created: {parent} is not writable; fix: pass a "
             "--workdir you can write to")
      return


# orbax asks it about a gs:// bucket's layout when it lists checkpoints.
GCS_CLIENT = "google.cloud.storage"


def _has_module(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except ModuleNotFoundError:  # a parent package is missing
    return False


def _check_remote_workdir(workdir) -> None:
  path = paths.as_path(workdir)
  if os.fspath(workdir).startswith("gs://") and not _has_module(GCS_CLIENT):
    fail(f"workdir {workdir}: orbax needs google-cloud-storage for gs:// checkpoints; fix: pip "
         "install google-cloud-storage gcsfs (experiments/README.md), or pass a local --workdir")
  try:
    is_file = path.exists() and not path.is_dir()
  except ImportError as e:  # fsspec names the package its scheme needs (gcsfs for gs://)
    fail(f"workdir {workdir} cannot be reached ({e}); fix: install that package, or pass a local "
         "--workdir")
  except NotImplementedError as e:  # a scheme epath does not know
    fail(f"workdir {workdir}: {e}; fix: use gs://, s3://, az:// or a local --workdir")
  except OSError as e:
    fail(f"workdir {workdir} cannot be reached ({type(e).__name__}: {e}); fix: check the bucket "
         "name and your credentials, or pass a local --workdir")
  if is_file:
    fail(f"workdir {workdir} is a file, not a folder; fix: pass a folder to --workdir (new, or a "
         "run's workdir to resume it)")


def check_init_from(config) -> None:
  """init_from names a converted checkpoint (params/) or a training workdir (checkpoints/)."""
  path = config.get("init_from")
  if not path:
    return
  folder = pathlib.Path(path)
  if not folder.exists():
    fail(f"init_from={path} does not exist; fix: point --config.init_from at a training workdir "
         "or a converted checkpoint (python -m bertjax.convert from-hf)")
  if not folder.is_dir():
    fail(f"init_from={path} is a file, not a folder; fix: point --config.init_from at a training "
         "workdir or a converted checkpoint folder")
  if not ((folder / "params").is_dir() or (folder / "checkpoints").is_dir()):
    fail(f"init_from={path} holds neither params/ (a converted checkpoint) nor checkpoints/ (a "
         "training workdir); fix: run `python -m bertjax.convert from-hf` or point at a workdir")


def check_init_from_model(config, objective) -> None:
  """init_from's model against the run's, before anything is prepared: pretraining trains
  config.model and starts it from what of init_from fits, so their architectures must agree;
  fine-tuning trains init_from's model, so a `--config.model.*` setting given (other than
  RUN_FIELDS, which apply to it) must agree with it, where it would otherwise be dropped."""
  path = config.get("init_from")
  records = [n for n in ("model.json", "config.json") if path and (paths.as_path(path) / n).is_file()]
  if not records:  # no init_from, or one without a record: the model's reader says so, if needed
    return
  fields = checkpoints.load_model_config(path)
  record = records[0]
  theirs = fields.get("architecture", "bert")
  if not model_from_checkpoint(config, objective):
    ours = config.model.architecture
    if ours != theirs:
      fail(f"init_from={path} holds a {theirs} model but this run pretrains "
           f"model.architecture={ours!r}: almost none of its weights would fit, and the rest would "
           f"start fresh; fix: pretrain a {theirs} model (--config.model.architecture={theirs} "
           f"with the sizes in its {record}), or an init_from of architecture {ours}")
    return
  default = ModelConfig()
  given = sorted(k.removeprefix("model.") for k in config_lib.overridden(config)
                 if k.startswith("model.") and k.removeprefix("model.") not in RUN_FIELDS)
  differ = []
  for key in given:
    want = fields.get(key, getattr(default, key, None))
    if json.dumps(config.model[key], default=str) != json.dumps(want, default=str):
      differ.append(f"model.{key}={config.model[key]!r} (init_from's: {want!r})")
  if differ:
    fail(f"{'; '.join(differ)}: fine-tuning trains the model of init_from={path} as its "
         f"{record} describes it, so {'this setting' if len(differ) == 1 else 'these settings'} "
         f"would be dropped; fix: drop {', '.join('--config.' + d.split('=')[0] for d in differ)} "
         "(only dropout, dtype, remat, kernel and classifier-pooling settings apply to it), or "
         "fine-tune another init_from")


def check_settings(config, workdir=None) -> None:
  """What the config alone decides; first thing of a run, before anything is created."""
  check_ranges(config)
  if workdir is not None:
    check_workdir(workdir)
  check_init_from(config)


def check_config(config) -> None:
  """What the config alone decides, without a workdir, a device or a file read (a sweep checks
  each point so before any runs): the ranges, config.model's own fields, and, when the model is
  config.model (no init_from), max_seq_length against its positions."""
  check_ranges(config)
  model_cfg = ModelConfig.from_dict(config.model.to_dict())
  if not config.get("init_from"):
    check_positions(config, model_cfg)


# ---------------------------------------------------------------------------------------------
# The mesh, the batch and the model actually trained.


def accumulation_steps(config, mesh) -> int:
  """`grad_accum_steps`, checked against the batch, the data-parallel size and the processes."""
  dp = sharding.data_parallel_size(mesh)
  accum = int(config.grad_accum_steps)
  if accum < 1 or config.batch_size % (dp * accum):
    unit = dp * max(accum, 1)
    fitting = max(unit, config.batch_size // unit * unit)
    fail(f"batch_size={config.batch_size} must be divisible by data-parallel size {dp} x "
         f"grad_accum_steps {accum}; fix: --config.batch_size={fitting} or another "
         "--config.grad_accum_steps")
  if config.batch_size % jax.process_count():
    fail(f"batch_size={config.batch_size} must be divisible by the process count "
         f"{jax.process_count()}; fix: a --config.batch_size divisible by {jax.process_count()}")
  return accum


def check_eval_batch_size(size: int, mesh) -> None:
  """Rows per evaluation batch (bertjax/trainer/run_plan.py derives them): a positive multiple of
  the data-parallel size and the process count."""
  dp = sharding.data_parallel_size(mesh)
  if size <= 0 or size % dp or size % jax.process_count():
    fail(f"eval_batch_size={size} must be a positive multiple of the data-parallel size {dp} and "
         f"the process count {jax.process_count()}; fix: set --config.eval_batch_size")


def check_positions(config, model_cfg, source: str = "") -> None:
  """max_seq_length within the position table of the model trained (`source`: where its
  architecture comes from, when not from config.model)."""
  n = model_cfg.max_position_embeddings - model_cfg.position_offset
  if config.max_seq_length <= n:
    return
  if source:
    fail(f"max_seq_length={config.max_seq_length} exceeds the {n} positions of the model of "
         f"{source}; fix: --config.max_seq_length={n} or less (its position table is fixed)")
  fail(f"max_seq_length={config.max_seq_length} exceeds the model's {n} positions "
       f"(model.max_position_embeddings={model_cfg.max_position_embeddings}); fix: "
       f"--config.max_seq_length={n} or raise --config.model.max_position_embeddings")


def _model_dims(cfg) -> list[tuple[str, str, int]]:
  """(logical axis, setting, size) of the model's parameter dimensions (bertjax/models)."""
  dims = [("heads", "num_attention_heads", cfg.num_attention_heads),
          ("mlp", "intermediate_size", cfg.intermediate_size),
          ("embed", "hidden_size", cfg.hidden_size), ("embed_out", "hidden_size", cfg.hidden_size),
          ("vocab", "vocab_size", cfg.vocab_size), ("kv", "head size", cfg.head_dim)]
  # A pruned layer's own head count (bertjax.prune) is sharded over the same axis.
  dims += [("heads", f"pruned_heads[{i}] (leaving {cfg.layer_heads(i)} heads)", cfg.layer_heads(i))
           for i in range(cfg.num_hidden_layers) if cfg.pruned_heads and cfg.pruned_heads[i]]
  if cfg.embedding_size:
    dims += [("embed", "embedding_size", cfg.embedding_size),
             ("embed_in", "embedding_size", cfg.embedding_size)]
  if cfg.scan_layers:
    dims.append(("layers", "num_hidden_layers", cfg.num_hidden_layers))
  return dims


def _mesh_axes(rules, name: str) -> tuple[str, ...]:
  axes = next((a for n, a in rules if n == name), None)
  return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def check_mesh(config, model_cfg, mesh, from_checkpoint: bool = False, rules=None) -> None:
  """Each model dimension divisible by the mesh axes its logical axis is sharded over (`rules`:
  the run's logical rules, by default the config's)."""
  rules = sharding.rules_from_config(config) if rules is None else rules
  shape = dict(mesh.shape)
  for name, setting, value in _model_dims(model_cfg):
    axes = _mesh_axes(rules, name)
    size = math.prod(shape.get(a, 1) for a in axes)
    if value % size == 0:
      continue
    fix = ""
    if len(axes) == 1:
      fitting = {**shape, axes[0]: math.gcd(value, size)}
      if axes[0] != "data":
        fitting["data"] = -1
      fix = f"--config.mesh_shape='{tuple(fitting[a] for a in sharding.MESH_AXES)}'"
    if setting == "vocab_size" and not from_checkpoint:
      padded = -(-value // size) * size
      fix = " or ".join(filter(None, [fix, f"--config.model.vocab_size={padded} (padded)"]))
    fail(f"model.{setting}={value} is not divisible by {size}, the size of mesh axis "
         f"{'x'.join(axes)} that its logical axis {name!r} is sharded over (mesh_shape="
         f"{tuple(shape.values())}); fix: {fix or 'a --config.mesh_shape whose sizes divide it'}")


def check_fused_update(config, mesh, rules=None) -> None:
  """optimizer.fused_update groups parameters into flat buffers (bertjax.runtime.optim
  `grouped_update`): only where each update is elementwise per group (adamw, adam, sgd) and no
  parameter is sharded (a flat buffer of sharded tensors would gather them on every device)."""
  o = config.optimizer
  if not o.get("fused_update", False):
    return
  if o.name not in optim.FUSED_OPTIMIZERS:
    what = "trust ratio" if o.name == "lamb" else "update clipping"
    fail(f"optimizer.fused_update=True cannot group optimizer.name={o.name!r}: its {what} is "
         f"computed per parameter tensor, which a flat buffer of many tensors does not keep; fix: "
         f"--config.optimizer.fused_update=False, or --config.optimizer.name=adamw")
  rules = sharding.rules_from_config(config) if rules is None else rules
  shape = dict(mesh.shape)
  sharded: dict[str, list[str]] = {}  # mesh axis -> the parameters' logical axes on it
  for name, _ in rules:
    for a in _mesh_axes(rules, name):
      if not name.startswith("act_") and shape.get(a, 1) > 1:
        sharded.setdefault(a, []).append(repr(name))
  if sharded:
    over = "; ".join(f"mesh axis {a} (logical axes {', '.join(n)})" for a, n in sharded.items())
    fail(f"optimizer.fused_update=True flattens the parameters into a few buffers, but mesh_shape="
         f"{tuple(shape.values())} shards them over {over}: the buffers would "
         f"gather them on every device; fix: --config.optimizer.fused_update=False, or a "
         f"mesh_shape that splits only the batch, e.g. --config.mesh_shape='(-1, 1, 1)'")


def check_run(config, objective, model_cfg, mesh, workdir=None, *, rules=None,
              eval_batch_size: int | None = None) -> int:
  """The checks that need the mesh and the model trained (and, pretraining from init_from on raw
  text, its tokenizer); returns grad_accum_steps. `rules` and `eval_batch_size`: the run's, by
  default the config's."""
  accum = accumulation_steps(config, mesh)
  if "eval_batch_size" in config:
    check_eval_batch_size(settings.eval_batch_size(config) if eval_batch_size is None
                          else eval_batch_size, mesh)
  if objective.data_kind != "task" and config.max_predictions_per_seq >= config.max_seq_length:
    fail(f"max_predictions_per_seq={config.max_predictions_per_seq} must be below max_seq_length="
         f"{config.max_seq_length}; fix: --config.max_predictions_per_seq="
         f"{max(1, round(config.max_seq_length * 0.15))}")
  batch_warmup.check(config, accum, task=objective.data_kind == "task")
  if getattr(objective, "pair_head", False):  # NSP/SOP: refused before any data is prepared
    refuse_pair_head(model_cfg)
  from_checkpoint = model_from_checkpoint(config, objective)
  check_positions(config, model_cfg, f"init_from={config.init_from}" if from_checkpoint else "")
  check_mesh(config, model_cfg, mesh, from_checkpoint=from_checkpoint, rules=rules)
  check_fused_update(config, mesh, rules)
  check_corpus_tokenizer(config, objective, workdir)
  check_freeze(config, objective, model_cfg)
  check_fp8(objective, model_cfg)
  return accum


def check_objective(config, objective) -> None:
  """What the objective asks of the pretraining data, checked before a tokenizer is trained or a
  corpus prepared: its masking (span_sbo: span), its rows' length, packing."""
  if objective.data_kind == "task" or config.data.synthetic:
    return
  if not (config.data.generated or config.get("data_dir") or config.data.corpus):
    fail("no training data: set --config.data_dir to a prepared corpus or --config.data.corpus to "
         "raw text files")
  objective.masking(config)
  kind = check_data_kind(config, objective)
  instances.check_kind(kind, config.max_seq_length)
  if config.data.pack:
    packing.check_packing(kind, config.data.pack_bins)


def check_process_rows(mesh) -> None:
  """Process p of n feeds rows [p/n, (p+1)/n) of every global batch (`sharding.shard_batch`, the
  input pipeline's shares): refused, in one line, where the mesh's batch axes do not give each
  process that block of the batch (fewer batch shards than processes, or devices of several
  processes interleaved along them). The processes are those of the mesh's devices: this run's,
  or a compiled target's hosts (compile-only devices of a pod slice, bertjax/tools/targets.py)."""
  shards = sharding.data_parallel_size(mesh)
  by_process: dict[int, set[int]] = {}
  for device, idx in sharding.batch_sharding(mesh).devices_indices_map((shards,)).items():
    by_process.setdefault(device.process_index, set()).add(idx[0].start or 0)
  n = len(by_process)
  if shards % n or any(sorted(starts) != list(range(i * shards // n, (i + 1) * shards // n))
                       for i, (_, starts) in enumerate(sorted(by_process.items()))):
    fail(f"mesh_shape={tuple(mesh.shape.values())} splits the batch {shards} ways over the "
         f"{sharding.BATCH_AXES} axes, which does not give each of the {n} processes its own "
         f"block of rows; make data * fsdp a multiple of {n} (e.g. --config.mesh_shape='({n}, -1, "
         "1)')")


@dataclasses.dataclass(frozen=True)
class Checked:
  """What `check` checked the config against, derived once: the run's own."""
  mesh: Any
  rules: Any                # logical axis rules (bertjax/runtime/sharding.py)
  model_cfg: ModelConfig    # the model trained: fine-tuning takes init_from's
  grad_accum_steps: int
  eval_batch_size: int      # rows per evaluation batch


def check(config, workdir, objective, devices: Sequence[Any] | None = None) -> Checked:
  """Every check of a run's settings that comes before its inputs (the module docstring's order),
  on the mesh of `devices` (default: every device); returns what they were checked against."""
  check_settings(config, workdir)
  objective.check(config)
  check_init_from_model(config, objective)
  mesh = sharding.make_mesh(config.mesh_shape, devices)
  check_process_rows(mesh)  # several processes: each feeds its block of the batch
  model_cfg = objective.model_config(config)  # trained: fine-tuning takes init_from's
  rules = sharding.rules_from_config(config)
  eval_size = settings.eval_batch_size(config)
  accum = check_run(config, objective, model_cfg, mesh, workdir, rules=rules,
                    eval_batch_size=eval_size)
  check_objective(config, objective)
  return Checked(mesh=mesh, rules=rules, model_cfg=model_cfg, grad_accum_steps=accum,
                 eval_batch_size=eval_size)


# Unlabelled kinds: an objective that reads no sentence-pair label may train on either.
UNLABELLED_KINDS = ("full", "single")


def check_data_kind(config, objective) -> str:
  """The instances the pipeline builds: `data.kind` when set (ModernBERT's recipe packs 'single'
  ones, each [CLS] document [SEP] split to fit, for mlm), else the objective's; refused where
  they do not suit the objective."""
  kind = config.data.get("kind", "") or objective.data_kind
  if kind != objective.data_kind and {kind, objective.data_kind} - set(UNLABELLED_KINDS):
    fail(f"data.kind={kind!r} does not suit objective {objective.name!r} (its instances are "
         f"{objective.data_kind!r}); fix: --config.data.kind= (empty), or full or single for an "
         "objective without a sentence-pair label")
  return kind


# Objectives whose loss applies a model the trainer does not hand it (a distillation's student,
# beside its teacher): the FP8 scale state would not reach it.
FP8_REFUSED_OBJECTIVES = ("distill", "distill_glue")


def check_fp8(objective, model_cfg) -> None:
  """model.fp8 (bertjax/models/fp8.py) where its scale state is one per projection and reaches
  the model: the BERT family's encoder, a layer per parameter set, not scanned, not distilled."""
  if not model_cfg.fp8:
    return
  if model_cfg.architecture == "modernbert":
    fail("model.fp8=True covers the BERT family's encoder layers, not ModernBERT's; fix: "
         "--config.model.fp8=False")
  if model_cfg.scan_layers:
    fail("model.fp8=True keeps a scale state per layer, which model.scan_layers=True would share "
         "across the scanned layers; fix: --config.model.scan_layers=False")
  if model_cfg.num_groups != model_cfg.num_hidden_layers:
    fail(f"model.fp8=True keeps a scale state per layer, which ALBERT's shared layers "
         f"(model.num_hidden_groups={model_cfg.num_hidden_groups}) would share; fix: "
         "--config.model.fp8=False")
  if objective.name in FP8_REFUSED_OBJECTIVES:
    fail(f"model.fp8=True does not reach objective {objective.name!r}'s student (its loss "
         "applies the model beside its teacher); fix: --config.model.fp8=False")


def check_freeze(config, objective, model_cfg) -> None:
  """freeze.* and head.* against the objective and the model trained
  (bertjax/runtime/freezing.py)."""
  freeze, head = _get(config, "freeze"), _get(config, "head")
  if freeze is not _MISSING:
    _check_freeze_block(config, objective, model_cfg, freeze)
  if head is _MISSING:
    return
  if head.features != "standard" and not getattr(objective, "feature_heads", False):
    fail(f"head.features={head.features!r} applies to fine-tuning tasks (glue, squad, ner), not "
         f"objective {config.objective}; fix: --config.head.features=standard")
  if head.features in ("concat", "scalar_mix"):
    problem = features.layers_error(tuple(head.layers), model_cfg.num_hidden_layers)
    if problem:
      usable = features.top_layers(model_cfg.num_hidden_layers)
      fail(f"head.layers={tuple(head.layers)} {problem}; fix: --config.head.layers='{usable}'")


def _check_freeze_block(config, objective, model_cfg, freeze) -> None:
  top, layers = freeze.train_top_layers, model_cfg.num_hidden_layers
  if not freeze.encoder:
    if top or freeze.train_embeddings:
      key = "train_top_layers" if top else "train_embeddings"
      fail(f"freeze.{key}={freeze[key]!r} applies only with freeze.encoder=True; fix: "
           f"--config.freeze.encoder=True or --config.freeze.{key}={'0' if top else 'False'}")
    return
  if not getattr(objective, "feature_heads", False):
    fail(f"freeze.encoder=True applies to fine-tuning tasks (glue, squad, ner), not objective "
         f"{config.objective}; fix: --config.freeze.encoder=False")
  if top > layers:
    fail(f"freeze.train_top_layers={top} exceeds the model's {layers} layers; fix: "
         f"--config.freeze.train_top_layers={layers} or less")
  if top and model_cfg.scan_layers:
    fail(f"freeze.train_top_layers={top} needs separate layers, but model.scan_layers=True stacks "
         "them into one array per weight; fix: --config.model.scan_layers=False or "
         "--config.freeze.train_top_layers=0")
  if top and model_cfg.num_groups != layers:
    fail(f"freeze.train_top_layers={top}: the model's {layers} layers share {model_cfg.num_groups} "
         "parameter group(s) (ALBERT), so no layer trains alone; fix: "
         "--config.freeze.train_top_layers=0")


def model_from_checkpoint(config, objective) -> bool:
  """Whether the architecture trained is init_from's: fine-tuning tasks take it from there
  (tasks/base.py); pretraining builds config.model and copies what fits."""
  return bool(config.get("init_from")) and objective.data_kind == "task"


def check_param_shardings(abstract_params, shardings) -> None:
  """Every parameter dimension divisible by the mesh axes it is sharded over (what jit would
  refuse with a traceback), naming the parameter."""
  flat = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
  for (path, leaf), named in zip(flat, jax.tree.leaves(shardings)):
    shape = getattr(leaf, "value", leaf).shape
    for dim, axes in zip(shape, named.spec):
      axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
      size = math.prod(named.mesh.shape[a] for a in axes)
      if dim % size:
        name = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
        fail(f"parameter {name} has a dimension of {dim}, not divisible by {size}, the size of "
             f"mesh axis {'x'.join(axes)} (mesh_shape={tuple(named.mesh.shape.values())}); fix: a "
             "--config.mesh_shape whose sizes divide the model's, or --config.logical_rules")


# ---------------------------------------------------------------------------------------------
# The data against the model.


def _init_from_tokenizer(config) -> pathlib.Path | None:
  path = config.get("init_from")
  folder = pathlib.Path(path) / "tokenizer" if path else None
  return folder if folder is not None and folder.is_dir() else None


def check_tokenizer(config, tokenizer, source: str, fix: str) -> None:
  """`tokenizer` (the data's, from `source`) is the one init_from was trained with (its
  tokenizer/ folder): the same vocabulary, id for id, and casing. `fix`: what to do otherwise."""
  folder = _init_from_tokenizer(config)
  if tokenizer is None or folder is None:
    return
  theirs = tokenizers.load_tokenizer(folder)
  if theirs.vocab_size == tokenizer.vocab_size and theirs.fingerprint() == tokenizer.fingerprint():
    return
  ours_text = f"{tokenizer.kind}, {tokenizer.vocab_size} tokens"
  theirs_text = f"{theirs.kind}, {theirs.vocab_size} tokens"
  if ours_text == theirs_text:
    ours_text += ", other pieces or casing"
  fail(f"the data is tokenized differently ({source}: {ours_text}) from what init_from="
       f"{config.init_from} was trained on ({theirs_text}); fix: {fix}")


def check_corpus_tokenizer(config, objective, workdir) -> None:
  """Pretraining from init_from on raw text: the corpus will be tokenized with init_from's
  tokenizer (checked before it is prepared into WORKDIR/prepared, not after)."""
  folder = _init_from_tokenizer(config)
  if (folder is None or objective.data_kind == "task" or config.data.synthetic
      or config.get("data_dir") or workdir is None
      or (paths.as_path(workdir) / "prepared" / "meta.json").exists()):
    return
  if not config.data.tokenizer:
    fail(f"init_from={config.init_from} was trained with its own tokenizer, but a new one would be "
         f"trained on data.corpus; fix: --config.data.tokenizer={folder}")
  check_tokenizer(config, tokenizers.load_tokenizer(config.data.tokenizer),
                  f"data.tokenizer={config.data.tokenizer}", f"--config.data.tokenizer={folder}")


def _data_source(config, objective, workdir) -> tuple[str, str]:
  """Where the data's tokenizer came from, and the fix that gives init_from's instead."""
  folder = _init_from_tokenizer(config)
  if objective.data_kind == "task":
    source = (f"data.tokenizer={config.data.tokenizer}" if config.data.tokenizer
              else "the data's tokenizer")
    return source, "leave --config.data.tokenizer empty (init_from's tokenizer is then used)"
  if config.get("data_dir"):
    return (f"the corpus prepared in data_dir={config.data_dir}",
            f"prepare the corpus with it (python -m bertjax.data.prepare --tokenizer {folder}) "
            "and point --config.data_dir there")
  prepared = paths.as_path(workdir or ".") / "prepared"
  return (f"the corpus prepared in {prepared}",
          f"--config.data.tokenizer={folder} and a new --workdir ({prepared} holds the corpus "
          "tokenized the other way)")


def check_vocab(config, model_cfg, vocab_size: int, from_checkpoint: bool) -> None:
  """The data's ids fit the model's vocabulary."""
  if vocab_size <= model_cfg.vocab_size:
    return
  if from_checkpoint:
    fail(f"the data's tokenizer has {vocab_size} tokens but the model of init_from="
         f"{config.init_from} has {model_cfg.vocab_size}; fix: use init_from's own tokenizer "
         "(leave --config.data.tokenizer empty)")
  fail(f"the tokenizer has {vocab_size} tokens but model.vocab_size is {model_cfg.vocab_size}; "
       f"fix: --config.model.vocab_size={vocab_size}")


def check_data(config, objective, model_cfg, data, workdir=None) -> None:
  """The built inputs against init_from's tokenizer and the model's vocabulary."""
  check_tokenizer(config, data.tokenizer, *_data_source(config, objective, workdir))
  check_vocab(config, model_cfg, data.vocab_size, model_from_checkpoint(config, objective))
