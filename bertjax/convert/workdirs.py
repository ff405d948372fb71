"""Conversion both ways and the converted folders bertjax writes and reads."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import uuid
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import orbax.checkpoint as ocp

from bertjax.convert import hf_tokenizer
from bertjax.convert.hf_configs import ELECTRA_PARTS, TASK_CLASSES, hf_config_to_model_config
from bertjax.convert.models import check_tree, fresh_part
from bertjax.convert.names import (TASK_HEADS, architecture_heads, encoder_entries, hf_to_params,
                                   task_head_entries)
from bertjax.convert.readers import one_line, read_hf_config, read_hf_weights
from bertjax.core import digests, paths
from bertjax.core.errors import UserError, fail
from bertjax.models.config import ModelConfig
from bertjax.runtime import checkpoints

PathLike = str | os.PathLike
Params = dict[str, Any]

# ----------------------------------------------------------------------------- conversion


@dataclasses.dataclass
class Converted:
  """A model in our format: config, params {"encoder", *heads} (numpy float32) and what the
  conversion did. For ELECTRA `--part both`, `generator` holds the generator network too.
  `task`: model.json's fine-tuning head (kind, name, num_labels, ...: a pruned classifier's,
  bertjax.prune), whose tree params[task["name"]] holds; `unnamed`: trees in params/ that
  model.json describes nowhere (left out of `params`)."""
  config: ModelConfig
  params: Params
  heads: tuple[str, ...]
  missing: tuple[str, ...] = ()
  ignored: tuple[str, ...] = ()
  hf_model_type: str = ""
  part: str | None = None
  generator: "Converted | None" = None
  task: dict[str, Any] | None = None
  unnamed: tuple[str, ...] = ()


def _electra_part(sd: Mapping[str, np.ndarray], part: str | None, model_dir: PathLike) -> str:
  has_disc = any(k.startswith("discriminator_predictions.") for k in sd)
  has_gen = any(k.startswith(("generator_predictions.", "generator_lm_head.")) for k in sd)
  if part is None:
    return "generator" if has_gen and not has_disc else "discriminator"
  if part == "generator" and has_disc and not has_gen:
    fail(f"{model_dir} holds an ELECTRA discriminator (discriminator_predictions.*), not a "
         "generator; use --part discriminator")
  if part == "discriminator" and has_gen and not has_disc:
    fail(f"{model_dir} holds an ELECTRA generator (generator_predictions.*), not a "
         "discriminator; use --part generator")
  return part


def load_hf(model_dir: PathLike, part: str | None = None, heads: bool = True) -> Converted:
  """Converts a Hugging Face folder (local, or remote: read from a local copy) in memory.

  part: ELECTRA only: "discriminator", "generator", "both" (a folder with discriminator/ and
  generator/ subfolders) or None (detect from the tensors). heads=False keeps only the encoder.
  """
  if part is not None and part not in ELECTRA_PARTS:
    fail(f"unknown part {part!r}; use one of {', '.join(ELECTRA_PARTS)}")
  d = _local_copy(model_dir)
  if part == "both":
    for sub in ("discriminator", "generator"):
      if not (d / sub / "config.json").is_file():
        fail(f"{d / sub / 'config.json'} not found; --part both needs a folder with "
             "discriminator/ and generator/ Hugging Face ELECTRA subfolders")
    disc = load_hf(d / "discriminator", "discriminator", heads)
    disc.generator = load_hf(d / "generator", "generator", heads)
    disc.part = "both"
    return disc
  hf = read_hf_config(d)
  cfg = hf_config_to_model_config(hf)
  if part is not None and cfg.architecture != "electra":
    fail(f"--part applies to ELECTRA checkpoints only; {d} is {cfg.architecture}: drop --part")
  sd = read_hf_weights(d)
  if cfg.architecture == "electra":
    part = _electra_part(sd, part, d)
  task = task_from_hf_config(hf, cfg) if heads else None
  if task is not None:
    return _load_task(sd, cfg, task, d)
  want = architecture_heads(cfg.architecture, part) if heads else ()
  if "mlm" in want and hf.get("tie_word_embeddings") is False:
    fail(f"{d / 'config.json'} sets tie_word_embeddings=false; bertjax's MLM decoder is tied to "
         "the word embeddings, so only tied checkpoints convert")
  params, missing, ignored = hf_to_params(sd, cfg, want)
  for i, name in enumerate(missing):
    fresh = fresh_part(cfg, name, i)
    if name == "pooler":
      params["encoder"]["pooler"] = fresh
    else:
      params[name] = fresh
  params = to_numpy(params)
  check_tree(params, cfg, want, str(d), str(d / "config.json"))
  return Converted(cfg, params, want, tuple(missing), tuple(ignored), cfg.architecture, part)


# The architectures whose fine-tuned classes from-hf reads with their task head (the others:
# the encoder, and fresh pretraining heads).
TASK_IMPORTS = ("modernbert",)


def task_from_hf_config(hf: Mapping[str, Any], cfg: ModelConfig) -> dict[str, Any] | None:
  """The task head (model.json's "task": see `bertjax.convert.sources.TaskHead`) of a fine-tuned
  class named in config.json's "architectures", None for the other classes."""
  kinds = {cls: kind for (arch, kind), cls in TASK_CLASSES.items() if arch == cfg.architecture}
  found = [kinds[a] for a in hf.get("architectures") or () if a in kinds]
  if cfg.architecture not in TASK_IMPORTS or not found:
    return None
  kind = found[0]
  if kind == "qa":
    num_labels, labels = 2, ["start", "end"]
  else:
    id2label = hf.get("id2label") or {}
    num_labels = len(id2label) or int(hf.get("num_labels", 2))
    labels = [str(id2label[k]) for k in sorted(id2label, key=int)] if id2label else None
  return {"kind": kind, "name": TASK_HEADS[kind][0], "num_labels": num_labels, "labels": labels,
          "regression": hf.get("problem_type") == "regression",
          "task": hf.get("finetuning_task") or "", "features": "standard",
          "layers": [-4, -3, -2, -1], "pooling": "cls"}


def _load_task(sd: Mapping[str, np.ndarray], cfg: ModelConfig, task: dict[str, Any],
               d: pathlib.Path) -> Converted:
  """A fine-tuned checkpoint: the encoder and its task head, every tensor required."""
  entries = encoder_entries(cfg) + task_head_entries(cfg, task["kind"], task["num_labels"])
  params, missing, ignored = hf_to_params(sd, cfg, (), entries)
  if missing:
    fail(f"{d} has no {task['name']} tensors though config.json names a fine-tuned class; "
         "check that the weights belong to this config.json")
  params = to_numpy(params)
  check_tree({"encoder": params["encoder"]}, cfg, (), str(d), str(d / "config.json"))
  return Converted(cfg, params, (), (), tuple(ignored), cfg.architecture, task=task)


def _local_copy(model_dir: PathLike) -> pathlib.Path:
  """A Hugging Face folder as a local path (the readers of safetensors and torch files read
  local files): itself, or a remote folder's local copy."""
  d = paths.as_path(model_dir)
  if not paths.is_remote(d):
    return pathlib.Path(d)
  if not d.is_dir():
    fail(f"{d} does not exist; pass a Hugging Face model folder (config.json + weights)")
  return paths.reading(d)


def to_numpy(tree: Any) -> Any:
  if isinstance(tree, Mapping):
    return {k: to_numpy(v) for k, v in tree.items()}
  return np.asarray(tree, dtype=np.float32)


def check_target(path: PathLike, flag: str) -> paths.Path:
  paths.check_output_folder(path, flag)
  path = paths.absolute(path)
  if path.exists() and (not path.is_dir() or any(path.iterdir())):
    fail(f"{flag} {path} is not empty; choose a new folder or delete it first")
  return path


@contextlib.contextmanager
def staging_dir(target: paths.Path) -> Iterator[pathlib.Path]:
  """A temporary folder beside `target`, renamed to it at the end; removed on any failure. A
  remote `target` gets a local temporary folder, uploaded on success (nothing on failure)."""
  if paths.is_remote(target):
    with paths.writing(target) as tmp:
      yield tmp
    return
  target = pathlib.Path(target)
  target.parent.mkdir(parents=True, exist_ok=True)
  # Not tempfile.mkdtemp: its 0700 mode would stick to the final folder; mkdir honours umask.
  tmp = target.parent / f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial"
  tmp.mkdir()
  try:
    yield tmp
    if target.exists():
      target.rmdir()  # Checked empty before any work.
    os.replace(tmp, target)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def _save_params(path: pathlib.Path, params: Params) -> None:
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(path, params)
  checkpointer.wait_until_finished()
  digests.write(paths.as_path(path))  # checked by every reader (restore_params_folder)


def _model_entry(c: Converted) -> dict[str, Any]:
  task = {"task": c.task} if c.task is not None else {}
  return {"model": c.config.to_dict(), "heads": list(c.heads), "missing": list(c.missing), **task}


def convert_from_hf(model_dir: PathLike, workdir: PathLike, part: str | None = None,
                    log: Callable[[str], Any] = print) -> Converted:
  """Hugging Face folder -> workdir with model.json, params/ and tokenizer/ (either may be
  remote)."""
  out = check_target(workdir, "--workdir")
  src = _local_copy(model_dir)
  tok_src = src / "discriminator" if part == "both" else src
  # Damaged tokenizer files fail here, before anything is written; incomplete ones are left out.
  warning = hf_tokenizer.check_import(tok_src) if tok_src.is_dir() else None
  c = load_hf(src, part)
  params = dict(c.params)
  meta = {**_model_entry(c), "hf_model_type": c.hf_model_type, "part": c.part,
          "source": str(paths.absolute(model_dir))}
  if c.generator is not None:
    params["generator"] = c.generator.params
    meta["generator"] = _model_entry(c.generator)
  with staging_dir(out) as tmp:
    _save_params(tmp / "params", params)
    copied = [] if warning else hf_tokenizer.copy_files(tok_src, tmp / "tokenizer")
    paths.replace_text(tmp / "model.json", json.dumps(meta, indent=2) + "\n")
  # The heads read from the checkpoint; those initialized fresh have a line of their own below.
  read = [h for h in c.heads if h not in c.missing]
  read += [f"{c.task['name']} ({c.task['kind']}, {c.task['num_labels']} labels)"] if c.task else []
  log(f"converted {c.hf_model_type} checkpoint {model_dir} -> {out} "
      f"(heads: {', '.join(read) or 'none'}"
      f"{'; generator: mlm' if c.generator is not None else ''})")
  for name, conv in (("", c), ("generator ", c.generator)):
    if conv is None:
      continue
    fresh_heads = [m for m in conv.missing if m != "pooler"]
    if fresh_heads:
      log(f"{name}missing heads, initialized fresh: {', '.join(fresh_heads)}")
    if "pooler" in conv.missing:
      log(f"{name}missing pooler, initialized fresh")
    if conv.ignored:
      shown = ", ".join(conv.ignored[:5]) + (", ..." if len(conv.ignored) > 5 else "")
      log(f"{name}ignored {len(conv.ignored)} tensor(s) bertjax does not use: {shown}")
  log(f"tokenizer files: {', '.join(copied) if copied else 'none found'}")
  if warning:
    log(warning)
  return c


def load_workdir(workdir: PathLike) -> Converted:
  """Reads a folder written by `convert_from_hf` (model.json + params/), local or remote."""
  d = paths.absolute(workdir)
  meta_path = d / "model.json"
  if not meta_path.is_file():
    fail(f"{meta_path} not found; pass a folder written by `python -m bertjax.convert from-hf`")
  try:
    meta = json.loads(meta_path.read_text())
    # The kernel set is chosen where the model runs, not where it was written.
    cfg = ModelConfig.from_dict({**meta["model"], "kernels": "auto"})
    heads = tuple(meta["heads"])
    task = meta.get("task")
    task_trees = ((str(task["name"]),) + (("scalar_mix",) if task.get("features") == "scalar_mix"
                                          else ())) if task else ()
  except (ValueError, KeyError, TypeError) as e:
    fail(f"cannot read {meta_path}: {one_line(e)}; re-run the conversion")
  except UserError as e:  # a setting of the wrong type or value: name the file it came from
    fail(f"{meta_path}: {e}; fix it or re-run the conversion")
  if not (d / "params").is_dir():
    fail(f"{d / 'params'} not found; re-run the conversion")
  try:
    params = checkpoints.restore_params_folder(d / "params")
  except UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    fail(f"cannot restore {d / 'params'}: {one_line(e)}; re-run the conversion")
  params = to_numpy(params)
  # A fine-tuning head (a pruned classifier, bertjax.prune) is checked by its reader
  # (sources.read_source); a tree model.json does not describe is set aside and named.
  unnamed = tuple(sorted(set(params) - {"encoder", "generator", *heads, *task_trees}))
  task_params = {k: params.pop(k) for k in task_trees if k in params}
  params = {k: v for k, v in params.items() if k in ("encoder", "generator", *heads)}
  generator = None
  if "generator" in meta:
    gen_cfg = ModelConfig.from_dict({**meta["generator"]["model"], "kernels": "auto"})
    gen_heads = tuple(meta["generator"]["heads"])
    gen_params = params.pop("generator", None)
    if gen_params is None:
      fail(f"{d / 'params'} has no generator tree though model.json lists one; "
           "re-run the conversion")
    check_tree(gen_params, gen_cfg, gen_heads, str(d / "params") + " [generator]")
    generator = Converted(gen_cfg, gen_params, gen_heads, part="generator",
                          hf_model_type=meta.get("hf_model_type", gen_cfg.architecture))
  check_tree(params, cfg, heads, str(d / "params"))
  absent = [k for k in task_trees if k not in task_params]
  if absent:
    fail(f"{d / 'params'} has no {absent[0]} tree though model.json names that task head; "
         "write the folder again")
  return Converted(cfg, {**params, **task_params}, heads, tuple(meta.get("missing", ())), (),
                   meta.get("hf_model_type", cfg.architecture), meta.get("part"), generator,
                   task, unnamed)
