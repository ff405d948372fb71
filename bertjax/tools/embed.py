"""Feature extraction: `python -m bertjax.tools.embed` writes an encoder's features of some text.

  python -m bertjax.tools.embed --workdir converted/ --input sentences.txt --output feats.npz
  python -m bertjax.tools.embed --workdir runs/rte --glue rte --split dev --data_dir glue_data/ \
      --output rte_dev.npz --pooling mean --layers=-4,-3,-2,-1 --tokens
  python -m bertjax.tools.embed --workdir converted/ --conll conll2003/valid.txt --output ner.npz \
      --tokens

--workdir: a converted folder (`python -m bertjax.convert from-hf`: model.json + params/) or a
training workdir (config.json + checkpoints/: the latest readable checkpoint's `encoder`).
Examples: `--input` one per line (an empty line is an example too, so row i is line i);
`--glue TASK --split train|dev|test` the official tsv in --data_dir (pairs as BERT encodes
them); `--conll FILE` one per sentence, its words joined by spaces. Each becomes [CLS] ... [SEP],
cut to --max_seq_length.

The .npz holds `pooled` <float32>[n, d] (d = hidden x the number of --layers, which are
concatenated; 0 names the embeddings, 1..L the layers, negative counts from the top), pooled by
--pooling: cls (the [CLS] row), mean (over real tokens, padding excluded) or pooler (the model's
pooler output; only with --layers=-1); with --tokens also `tokens` <float32>[n, seq, d] (zero at
padding), `attention_mask` and `input_ids` <int32>[n, seq]. A .npy output holds `pooled` alone.
The output is written beside its final name and renamed into place when complete, so a failed
run leaves no file; an existing output is kept unless --overwrite. Every path may be remote
(gs://...): a remote output is uploaded whole at the end.
"""

from __future__ import annotations

import functools
import io
import os
import pathlib
import sys
import time
from typing import Sequence

import jax
from absl import flags
import jax.numpy as jnp
import numpy as np

from bertjax.convert import loading
from bertjax.core import command_line, paths
from bertjax.core.errors import fail, read_text, run_cli
from bertjax.data import tokenizers
from bertjax.metrics import glue as glue_metrics, ner as ner_metrics
from bertjax.models import features
from bertjax.models.config import ModelConfig
from bertjax.models.encoder import Encoder
from bertjax.runtime import xla_defaults
from bertjax.tasks import glue as glue_task
from bertjax.tasks.base import batch_length

POOLINGS = ("cls", "mean", "pooler")


def load_encoder(workdir: str | os.PathLike) -> tuple[Encoder, dict, ModelConfig, pathlib.Path]:
  """(Encoder, its params, its config, the tokenizer folder) of any folder `bertjax.load` reads:
  a converted checkpoint, a training workdir (its latest complete checkpoint) or a best/ folder."""
  loaded = loading.load(workdir)
  tok = loaded.source.tokenizer
  if tok is None:
    fail(f"{workdir} has no tokenizer/ folder; converted checkpoints and training workdirs "
         "carry one")
  return loaded.model, loaded.params, loaded.config, tok


def read_examples(args) -> list[dict]:
  """Rows {sentence1, sentence2 (or None), label: None} from the chosen source."""
  if args.input:
    lines = read_text(args.input, "input file").splitlines()
    if not lines:
      fail(f"--input {args.input} is empty; give one example per line")
    return [{"sentence1": line, "sentence2": None, "label": None} for line in lines]
  if args.conll:
    sentences = ner_metrics.read_conll(args.conll)
    if not sentences:
      fail(f"--conll {args.conll} holds no sentence; give a CoNLL-2003 file")
    return [{"sentence1": " ".join(s.tokens), "sentence2": None, "label": None} for s in sentences]
  if not args.data_dir:
    fail("--glue reads the official tsv files; set --data_dir to glue_data/ or its task folder")
  task = glue_metrics.get_task(args.glue)
  if args.split not in task.files:
    fail(f"GLUE {task.name} has no {args.split} split; use --split {' or '.join(task.files)}")
  file, tried = glue_task.local_file(args.data_dir, task.name, args.split)
  if file is None:
    fail(f"GLUE {args.glue} {args.split} file not found (tried {' and '.join(tried)}); check "
         "--data_dir and --split")
  rows = glue_metrics.read_glue_tsv(file, task.name, args.split)
  return [{**r, "label": None} for r in rows]


@functools.partial(jax.jit, static_argnames=("model", "layers", "pooling"))
def _features(model, params, ids, mask, types, layers, pooling):
  """(pooled <float32>[batch, d], tokens <float32>[batch, seq, d]) of one batch."""
  out = model.apply({"params": params}, ids, mask, types, deterministic=True,
                    output_hidden_states=layers != (-1,))
  tokens = (out.last_hidden_state if layers == (-1,) else jnp.concatenate(
      [out.hidden_states[i] for i in features.resolve_layers(layers, model.config.num_hidden_layers)],
      axis=-1)).astype(jnp.float32)
  if pooling == "pooler":
    pooled = out.pooler_output.astype(jnp.float32)
  else:
    pooled = features.pool(tokens, mask, pooling)
  return pooled, tokens * mask[..., None]


def embed(model, params, arrays: dict[str, np.ndarray], layers: tuple[int, ...], pooling: str,
          batch_size: int, with_tokens: bool, log=print) -> dict[str, np.ndarray]:
  """Features of every row of `arrays` (input_ids, attention_mask, token_type_ids), in order,
  with a progress line; each batch cut to its longest row (rounded up to 32)."""
  n, seq = arrays["input_ids"].shape
  pooled, tokens = [], []
  start = time.time()
  for lo in range(0, n, batch_size):
    idx = np.minimum(np.arange(lo, lo + batch_size), n - 1)  # the last batch padded by repeats
    length = batch_length(arrays["attention_mask"][idx], 32)
    batch = [jnp.asarray(arrays[k][idx, :length])
             for k in ("input_ids", "attention_mask", "token_type_ids")]
    p, t = jax.device_get(_features(model, params, *batch, layers, pooling))
    real = min(batch_size, n - lo)
    pooled.append(p[:real])
    if with_tokens:
      tokens.append(np.pad(t[:real], ((0, 0), (0, seq - length), (0, 0))))
    done = lo + real
    log(f"embedded {done}/{n} examples ({done / max(time.time() - start, 1e-9):.1f}/s)")
  out = {"pooled": np.concatenate(pooled)}
  if with_tokens:
    out.update(tokens=np.concatenate(tokens), attention_mask=arrays["attention_mask"],
               input_ids=arrays["input_ids"])
  return out


def write_atomically(path: paths.Path, arrays: dict[str, np.ndarray]) -> None:
  """Writes beside `path`, then renames: a failure leaves no partial (or clobbered) file. A
  remote `path` is one object written whole."""
  if paths.is_remote(path):
    buffer = io.BytesIO()
    if path.suffix == ".npy":
      np.save(buffer, arrays["pooled"])
    else:
      np.savez(buffer, **arrays)
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.replace_bytes(path, buffer.getvalue())
    return
  path = pathlib.Path(path)
  # Opened as every other output is (mode 0666 less the umask: 0644), not mkstemp's 0600.
  tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
  try:
    with paths.disk_errors(path, sum(a.nbytes for a in arrays.values())), open(tmp, "wb") as f:
      if path.suffix == ".npy":
        np.save(f, arrays["pooled"])
      else:
        np.savez(f, **arrays)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise


PROG = "python -m bertjax.tools.embed"
SOURCES = ("input", "glue", "conll")  # exactly one of them


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_string("workdir", None, "converted folder or training workdir", flag_values=fv)
  flags.DEFINE_string("input", None, "text file, one example per line", flag_values=fv)
  flags.DEFINE_string("glue", None, "GLUE task whose --split tsv in --data_dir to read",
                      flag_values=fv)
  flags.DEFINE_string("conll", None, "CoNLL-2003 file, one example per sentence", flag_values=fv)
  flags.DEFINE_enum("split", "dev", ("train", "dev", "test"), "with --glue", flag_values=fv)
  flags.DEFINE_string("data_dir", "", "with --glue: glue_data/ or its task folder",
                      flag_values=fv)
  flags.DEFINE_string("output", None, ".npz (pooled, tokens, ...) or .npy (pooled)",
                      flag_values=fv)
  flags.DEFINE_enum("pooling", "cls", POOLINGS, "how one vector is made of the tokens'",
                    flag_values=fv)
  flags.DEFINE_string("layers", "-1", "hidden states to concatenate, e.g. -4,-3,-2,-1",
                      flag_values=fv)
  flags.DEFINE_bool("tokens", False, "also write per-token features (.npz)", flag_values=fv)
  flags.DEFINE_integer("batch_size", 32, "examples per forward pass", flag_values=fv)
  flags.DEFINE_integer("max_seq_length", None, "tokens per example, [CLS] and [SEP] included "
                       "(default: 128, or the model's positions if fewer)", flag_values=fv)
  flags.DEFINE_bool("overwrite", False, "replace an existing --output", flag_values=fv)


def parse_args(argv: Sequence[str]) -> flags.FlagValues:
  """The flags, with exactly one source of text (--input, --glue or --conll)."""
  args, _ = command_line.parse(argv, define_flags, prog=PROG, doc="Write an encoder's pooled "
                               "(and per-token) features of some text.",
                               required=["workdir", "output"])
  given = [f"--{name}" for name in SOURCES if args[name].value is not None]
  if len(given) > 1:
    fail(f"argument {given[1]}: not allowed with argument {given[0]}; see {PROG} --help")
  if not given:
    fail(f"one of the arguments --input --glue --conll is required; see {PROG} --help")
  return args


def check_args(args) -> tuple[paths.Path, tuple[int, ...]]:
  """The output path and the layers, refused in one line before anything is loaded."""
  out = paths.as_path(args.output)
  if out.is_dir():  # checked before the features are computed: os.replace refused it after
    fail(f"--output {out} is a folder; name a file, e.g. --output {out / 'features.npz'}")
  if out.suffix not in (".npz", ".npy"):
    fail(f"--output {out} must end in .npz or .npy")
  if out.suffix == ".npy" and args.tokens:
    fail("--tokens writes several arrays; use an .npz --output")
  if out.exists() and not args.overwrite:
    fail(f"--output {out} exists; pass --overwrite to replace it, or another --output")
  if not paths.is_remote(out) and (not out.parent.is_dir() or not os.access(out.parent, os.W_OK)):
    fail(f"--output {out}: {out.parent} is not a writable folder; create it or choose another")
  if args.batch_size < 1 or (args.max_seq_length is not None and args.max_seq_length < 3):
    fail("--batch_size must be >= 1 and --max_seq_length >= 3 ([CLS], a token, [SEP])")
  try:
    layers = tuple(int(x) for x in args.layers.split(","))
  except ValueError:
    fail(f"--layers={args.layers!r} must be comma-separated integers, e.g. -4,-3,-2,-1")
  if args.pooling == "pooler" and layers != (-1,):
    fail("--pooling pooler is the model's pooler output of the last layer; use --layers=-1")
  return out, layers


def main(argv=None) -> None:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  out, layers = check_args(args)
  model, params, cfg, tok_dir = load_encoder(args.workdir)
  problem = features.layers_error(layers, cfg.num_hidden_layers)
  if problem:
    fail(f"--layers={args.layers} {problem}")
  if args.pooling == "pooler" and not cfg.use_pooler:
    fail(f"the model of {args.workdir} has no pooler (ELECTRA, ModernBERT); use --pooling cls or "
         "mean")
  limit = cfg.max_position_embeddings - cfg.position_offset
  seq = min(128, limit) if args.max_seq_length is None else args.max_seq_length
  if seq > limit:
    fail(f"--max_seq_length {seq} exceeds the model's {limit} positions; fix: --max_seq_length {limit}")
  tokenizer = tokenizers.load_tokenizer(tok_dir)
  rows = read_examples(args)
  arrays, truncated = glue_task.encode_rows(tokenizer, rows, seq, False)
  print(f"{len(rows)} examples ({truncated} cut to {seq} tokens)", file=sys.stderr)
  log = lambda line: print(f"\r{line}", end="", file=sys.stderr, flush=True)
  result = embed(model, params, arrays, layers, args.pooling, args.batch_size, args.tokens, log)
  print(file=sys.stderr)
  write_atomically(out, result)
  shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in result.items())
  print(f"wrote {out}: {shapes}")


if __name__ == "__main__":
  xla_defaults.apply()  # before JAX starts a backend
  run_cli(main)
