"""Hugging Face interop: checkpoints of BERT, RoBERTa, ALBERT and ELECTRA, both ways.

  python -m bertjax.convert from-hf --model-dir HF_DIR --workdir OUT \
      [--part discriminator|generator|both]
  python -m bertjax.convert to-hf --workdir OUT --output HF_DIR

`from-hf` reads a Hugging Face folder (config.json + model.safetensors or pytorch_model.bin, any
tokenizer files) and writes OUT/model.json, OUT/params/ (an orbax checkpoint of
{"encoder": ..., <heads>...}) and OUT/tokenizer/. `to-hf` writes the reverse: a folder that
`transformers.AutoModel*.from_pretrained` loads. The Python entry points are `load_hf` (in
memory), `convert_from_hf`, `convert_to_hf` and `load_workdir`; `bertjax.from_hf` and
`bertjax.load` wrap them.

Heads (names in our param tree):
  mlm  BERT cls.predictions.*, RoBERTa lm_head.*, ALBERT predictions.*,
       ELECTRA generator_predictions.* + generator_lm_head.bias (decoders are tied to the
       word embeddings, as in every released checkpoint)
  pair BERT cls.seq_relationship (NSP), ALBERT sop_classifier.classifier (SOP)
  rtd  ELECTRA discriminator_predictions.*
A head the architecture has but the checkpoint lacks (a bare BertModel, a sentence-embedding
model) is initialized fresh with the model's own init and reported; so is a missing pooler.

ELECTRA ships its two networks as separate folders. `--part` picks which one a folder holds
(by default: detected from its tensors); `--part both` takes a folder with `discriminator/` and
`generator/` subfolders and stores the generator's tree under params["generator"].

This module must not import torch or transformers: safetensors are read with numpy, and torch
is imported only to unpickle a pytorch_model.bin.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import uuid
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from bertjax.errors import fail, run_cli
from bertjax.models.config import ACTIVATIONS, ModelConfig

PathLike = str | os.PathLike
Params = dict[str, Any]

HF_MODEL_TYPES = ("bert", "roberta", "albert", "electra")
TOKENIZER_FILES = ("vocab.txt", "vocab.json", "merges.txt", "spiece.model", "tokenizer.json",
                   "tokenizer_config.json", "special_tokens_map.json")
ELECTRA_PARTS = ("discriminator", "generator", "both")

# Values transformers' config classes use for keys a config.json leaves out (save_pretrained
# writes only the values that differ from PretrainedConfig's, so these can be absent).
_BERT_DEFAULTS = dict(
    vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
    intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2,
    layer_norm_eps=1e-12, pad_token_id=0)
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "bert": _BERT_DEFAULTS,
    "roberta": {**_BERT_DEFAULTS, "vocab_size": 50265, "pad_token_id": 1},
    "albert": {**_BERT_DEFAULTS, "vocab_size": 30000, "embedding_size": 128, "hidden_size": 4096,
               "num_attention_heads": 64, "intermediate_size": 16384, "num_hidden_groups": 1,
               "inner_group_num": 1, "hidden_act": "gelu_new", "hidden_dropout_prob": 0.0,
               "attention_probs_dropout_prob": 0.0},
    "electra": {**_BERT_DEFAULTS, "embedding_size": 128, "hidden_size": 256,
                "num_attention_heads": 4, "intermediate_size": 1024},
}
_SHARED_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "hidden_act", "hidden_dropout_prob",
                  "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
                  "layer_norm_eps", "pad_token_id")
# transformers activation names that are exactly one of ours.
_ACT_ALIASES = {"gelu_python": "gelu"}

# The Hugging Face class a converted folder is saved as, by architecture and heads.
_HF_CLASSES: dict[tuple[str, tuple[str, ...]], str] = {
    ("bert", ("mlm", "pair")): "BertForPreTraining", ("bert", ("mlm",)): "BertForMaskedLM",
    ("bert", ("pair",)): "BertForNextSentencePrediction", ("bert", ()): "BertModel",
    ("roberta", ("mlm",)): "RobertaForMaskedLM", ("roberta", ()): "RobertaModel",
    ("albert", ("mlm", "pair")): "AlbertForPreTraining", ("albert", ("mlm",)): "AlbertForMaskedLM",
    ("albert", ()): "AlbertModel",
    ("electra", ("rtd",)): "ElectraForPreTraining", ("electra", ("mlm",)): "ElectraForMaskedLM",
    ("electra", ()): "ElectraModel",
}
_HEAD_ORDER = ("mlm", "pair", "rtd")


# ----------------------------------------------------------------------------- configs


def hf_config_to_model_config(hf: Mapping[str, Any]) -> ModelConfig:
  """A transformers config.json (as a dict) -> our ModelConfig; unsupported settings fail."""
  model_type = hf.get("model_type")
  if model_type not in HF_MODEL_TYPES:
    fail(f"unknown architecture {model_type!r}; supported: {', '.join(HF_MODEL_TYPES)} "
         "(the model_type in config.json)")
  # A null in config.json means "the class default" for the fields we read.
  d = {**_HF_DEFAULTS[model_type], **{k: v for k, v in hf.items() if v is not None}}
  position_type = d.get("position_embedding_type", "absolute")
  if position_type != "absolute":
    fail(f"position_embedding_type={position_type!r} is not supported; only checkpoints with "
         "absolute position embeddings convert")
  if d.get("is_decoder") or d.get("add_cross_attention"):
    fail("decoder/cross-attention checkpoints are not supported; convert an encoder checkpoint")
  if model_type == "albert" and d.get("inner_group_num", 1) != 1:
    fail(f"ALBERT inner_group_num={d['inner_group_num']} is not supported; only checkpoints with "
         "inner_group_num=1 (every released ALBERT) convert")
  act = d["hidden_act"]
  act = _ACT_ALIASES.get(act, act) if isinstance(act, str) else act
  if act not in ACTIVATIONS:
    fail(f"hidden_act={act!r} in config.json has no bertjax equivalent; supported: "
         f"{', '.join(ACTIVATIONS)}")
  fields = {k: d[k] for k in _SHARED_FIELDS}
  fields.update(architecture=model_type, hidden_act=act)
  if model_type == "albert":
    fields.update(embedding_size=d["embedding_size"], num_hidden_groups=d["num_hidden_groups"])
  if model_type == "electra":
    # ElectraModel has no pooler; its generator head hard-codes exact GELU.
    emb = d["embedding_size"]
    fields.update(embedding_size=None if emb == d["hidden_size"] else emb, use_pooler=False,
                  mlm_head_act="gelu")
  if model_type == "roberta":
    fields["mlm_head_act"] = "gelu"  # RobertaLMHead hard-codes exact GELU.
  return ModelConfig(**fields)


def model_config_to_hf_config(cfg: ModelConfig, architectures: list[str] | None = None
                              ) -> dict[str, Any]:
  """Our ModelConfig -> a transformers config.json dict; settings HF cannot express fail."""
  t = cfg.architecture
  if cfg.pre_layer_norm:
    fail("a pre_layer_norm model has no Hugging Face equivalent; only post-LN models export")
  if cfg.scan_layers:
    fail("a model.scan_layers checkpoint stacks its layers; export works on unrolled layers only "
         "(train or convert with scan_layers=False)")
  if t in ("bert", "roberta") and cfg.embed_size != cfg.hidden_size:
    fail(f"a {t} model with embedding_size != hidden_size has no Hugging Face equivalent; use "
         "architecture albert or electra for factorized embeddings")
  d: dict[str, Any] = {"model_type": t}
  if architectures:
    d["architectures"] = list(architectures)
  d.update({k: getattr(cfg, k) for k in _SHARED_FIELDS})
  d.update(initializer_range=0.02, position_embedding_type="absolute")
  if t == "albert":
    d.update(embedding_size=cfg.embed_size, num_hidden_groups=cfg.num_groups, inner_group_num=1)
  if t == "electra":
    d["embedding_size"] = cfg.embed_size  # ElectraConfig's default (128) would be wrong otherwise.
  return d


# ----------------------------------------------------------------------------- name mapping


@dataclasses.dataclass(frozen=True)
class Entry:
  """One tensor: its Hugging Face name, our param path, layout `kind` and HF shape.

  kinds: "copy" (same array), "linear" (torch [out, in] <-> our kernel [in, out]), "qkv_kernel"
  ([heads*head_dim, hidden] <-> [hidden, heads, head_dim]), "qkv_bias" ([heads*head_dim] <->
  [heads, head_dim]), "attn_out_kernel" ([hidden, heads*head_dim] <-> [heads, head_dim, hidden]).
  `part` says what the tensor belongs to: "encoder", "pooler" or a head name.
  """
  hf: str
  path: tuple[str, ...]
  kind: str
  shape: tuple[int, ...]
  part: str


def _linear(hf: str, path: tuple[str, ...], out: int, inp: int, part: str) -> list[Entry]:
  return [Entry(hf + ".weight", path + ("kernel",), "linear", (out, inp), part),
          Entry(hf + ".bias", path + ("bias",), "copy", (out,), part)]


def _layer_norm(hf: str, path: tuple[str, ...], size: int, part: str) -> list[Entry]:
  return [Entry(hf + ".weight", path + ("scale",), "copy", (size,), part),
          Entry(hf + ".bias", path + ("bias",), "copy", (size,), part)]


def encoder_entries(cfg: ModelConfig) -> list[Entry]:
  """The encoder's tensors, HF names with the base-model prefix ("bert.", "albert.", ...)."""
  from bertjax.models.encoder import has_embedding_projection  # pylint: disable=g-import-not-at-top
  t, p = cfg.architecture, cfg.architecture + "."
  e_size, hidden, inter = cfg.embed_size, cfg.hidden_size, cfg.intermediate_size
  emb = ("encoder", "embeddings")
  out = [
      Entry(p + "embeddings.word_embeddings.weight", emb + ("word_embeddings", "embedding"),
            "copy", (cfg.vocab_size, e_size), "encoder"),
      Entry(p + "embeddings.position_embeddings.weight", emb + ("position_embeddings", "embedding"),
            "copy", (cfg.max_position_embeddings, e_size), "encoder"),
      Entry(p + "embeddings.token_type_embeddings.weight",
            emb + ("token_type_embeddings", "embedding"), "copy", (cfg.type_vocab_size, e_size),
            "encoder"),
      *_layer_norm(p + "embeddings.LayerNorm", emb + ("layer_norm",), e_size, "encoder"),
  ]
  if has_embedding_projection(cfg):
    name = p + ("encoder.embedding_hidden_mapping_in" if t == "albert" else "embeddings_project")
    out += _linear(name, ("encoder", "embedding_projection"), hidden, e_size, "encoder")

  def layer(names: dict[str, str], g: int) -> list[Entry]:
    path = ("encoder", f"layer_{g}")
    att = path + ("attention",)
    res = []
    for proj in ("query", "key", "value"):
      res += [Entry(names[proj] + ".weight", att + (proj, "kernel"), "qkv_kernel", (hidden, hidden),
                    "encoder"),
              Entry(names[proj] + ".bias", att + (proj, "bias"), "qkv_bias", (hidden,), "encoder")]
    res += [Entry(names["attn_out"] + ".weight", att + ("output", "kernel"), "attn_out_kernel",
                  (hidden, hidden), "encoder"),
            Entry(names["attn_out"] + ".bias", att + ("output", "bias"), "copy", (hidden,),
                  "encoder")]
    res += _layer_norm(names["attn_ln"], path + ("attention_layer_norm",), hidden, "encoder")
    res += _linear(names["inter"], path + ("intermediate",), inter, hidden, "encoder")
    res += _linear(names["out"], path + ("output",), hidden, inter, "encoder")
    res += _layer_norm(names["out_ln"], path + ("output_layer_norm",), hidden, "encoder")
    return res

  if t == "albert":
    for g in range(cfg.num_groups):
      b = f"{p}encoder.albert_layer_groups.{g}.albert_layers.0."
      out += layer(dict(query=b + "attention.query", key=b + "attention.key",
                        value=b + "attention.value", attn_out=b + "attention.dense",
                        attn_ln=b + "attention.LayerNorm", inter=b + "ffn", out=b + "ffn_output",
                        out_ln=b + "full_layer_layer_norm"), g)
  else:
    # HF BERT has no layer sharing; a shared-layer model exports its groups repeated.
    for i in range(cfg.num_hidden_layers):
      b = f"{p}encoder.layer.{i}."
      out += layer(dict(query=b + "attention.self.query", key=b + "attention.self.key",
                        value=b + "attention.self.value", attn_out=b + "attention.output.dense",
                        attn_ln=b + "attention.output.LayerNorm", inter=b + "intermediate.dense",
                        out=b + "output.dense", out_ln=b + "output.LayerNorm"),
                   i * cfg.num_groups // cfg.num_hidden_layers)
  if cfg.use_pooler and t != "electra":
    out += _linear(p + ("pooler" if t == "albert" else "pooler.dense"), ("encoder", "pooler"),
                   hidden, hidden, "pooler")
  return out


# MLM head names per architecture: (dense, LayerNorm, output bias).
_MLM_NAMES = {
    "bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
             "cls.predictions.bias"),
    "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
    "albert": ("predictions.dense", "predictions.LayerNorm", "predictions.bias"),
    "electra": ("generator_predictions.dense", "generator_predictions.LayerNorm",
                "generator_lm_head.bias"),
}
_PAIR_NAMES = {"bert": "cls.seq_relationship", "albert": "sop_classifier.classifier"}
# The output bias is tied to the decoder's; a checkpoint may keep either name.
_ALIASES = {"cls.predictions.bias": "cls.predictions.decoder.bias",
            "lm_head.bias": "lm_head.decoder.bias", "predictions.bias": "predictions.decoder.bias"}
# Tensors that are tied copies or buffers, never real parameters of ours.
_TIED_OR_BUFFERS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
                    "lm_head.decoder.weight", "lm_head.decoder.bias", "predictions.decoder.weight",
                    "predictions.decoder.bias", "generator_lm_head.weight")


def head_entries(cfg: ModelConfig, head: str) -> list[Entry]:
  t, hidden, e_size = cfg.architecture, cfg.hidden_size, cfg.embed_size
  if head == "mlm":
    dense, ln, bias = _MLM_NAMES[t]
    return [*_linear(dense, ("mlm", "transform"), e_size, hidden, "mlm"),
            *_layer_norm(ln, ("mlm", "layer_norm"), e_size, "mlm"),
            Entry(bias, ("mlm", "bias"), "copy", (cfg.vocab_size,), "mlm")]
  if head == "pair":
    return _linear(_PAIR_NAMES[t], ("pair", "classifier"), 2, hidden, "pair")
  if head == "rtd":
    return [*_linear("discriminator_predictions.dense", ("rtd", "dense"), hidden, hidden, "rtd"),
            *_linear("discriminator_predictions.dense_prediction", ("rtd", "prediction"), 1,
                     hidden, "rtd")]
  raise ValueError(f"unknown head {head!r}")


def architecture_heads(architecture: str, part: str | None = None) -> tuple[str, ...]:
  """The heads a converted model of this architecture carries (ELECTRA: per network)."""
  if architecture == "electra":
    return ("mlm",) if part == "generator" else ("rtd",)
  return {"bert": ("mlm", "pair"), "roberta": ("mlm",), "albert": ("mlm", "pair")}[architecture]


def _to_ours(kind: str, x: np.ndarray, cfg: ModelConfig) -> np.ndarray:
  heads, head_dim, hidden = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
  if kind == "linear":
    return x.T
  if kind == "qkv_kernel":
    return x.T.reshape(hidden, heads, head_dim)
  if kind == "qkv_bias":
    return x.reshape(heads, head_dim)
  if kind == "attn_out_kernel":
    return x.T.reshape(heads, head_dim, hidden)
  return x


def _to_hf(kind: str, x: np.ndarray, cfg: ModelConfig) -> np.ndarray:
  hidden = cfg.hidden_size
  if kind == "linear":
    return x.T
  if kind == "qkv_kernel":
    return x.reshape(hidden, hidden).T
  if kind == "qkv_bias":
    return x.reshape(hidden)
  if kind == "attn_out_kernel":
    return x.reshape(hidden, hidden).T
  return x


def _get(tree: Mapping[str, Any], path: tuple[str, ...]) -> Any:
  for k in path:
    tree = tree[k]
  return tree


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
  for k in path[:-1]:
    tree = tree.setdefault(k, {})
  tree[path[-1]] = value


def _normalize_names(names: Iterable[str], architecture: str) -> dict[str, str]:
  """Canonical name -> name in the checkpoint.

  Canonical names carry the base-model prefix (a bare BertModel saves its tensors without it)
  and weight/bias for TF-era LayerNorm gamma/beta, as transformers renames them when loading.
  """
  prefix = architecture + "."
  out = {}
  for original in names:
    name = original
    if name.split(".")[0] in ("embeddings", "encoder", "pooler", "embeddings_project"):
      name = prefix + name
    if name.endswith(".gamma"):
      name = name[:-len("gamma")] + "weight"
    elif name.endswith(".beta"):
      name = name[:-len("beta")] + "bias"
    out[name] = original
  return out


def hf_to_params(state_dict: Mapping[str, np.ndarray], cfg: ModelConfig,
                 heads: tuple[str, ...]) -> tuple[Params, list[str], list[str]]:
  """Maps an HF state dict onto our tree {"encoder": ..., <heads present>...} (float32 numpy).

  Returns (params, missing, ignored): `missing` names the heads (and "pooler") the checkpoint
  lacks, `ignored` the checkpoint tensors nothing maps to. Any encoder tensor missing, or any
  tensor with the wrong shape, is a UserError naming it.
  """
  names = _normalize_names(state_dict, cfg.architecture)
  used: set[str] = set()
  params: Params = {}
  groups: dict[str, list[Entry]] = {}
  for e in encoder_entries(cfg) + [e for h in heads for e in head_entries(cfg, h)]:
    groups.setdefault(e.part, []).append(e)

  def lookup(name: str) -> str | None:
    if name in names:
      return name
    alias = _ALIASES.get(name)
    return alias if alias in names else None

  missing = []
  for part, entries in groups.items():
    found = [lookup(e.hf) for e in entries]
    if part != "encoder" and not any(found):
      missing.append(part)  # A whole head (or the pooler) absent: initialized fresh later.
      continue
    for e, name in zip(entries, found):
      if name is None:
        fail(f"checkpoint has no tensor {e.hf} (needed for {part}); check that the weights "
             f"belong to this config.json ({cfg.architecture}, {cfg.num_hidden_layers} layers)")
      x = np.asarray(state_dict[names[name]])
      if tuple(x.shape) != e.shape:
        fail(f"tensor {names[name]} has shape {tuple(x.shape)}, expected {e.shape} from "
             "config.json; the weights and config.json disagree")
      used.add(name)
      _set(params, e.path, np.ascontiguousarray(_to_ours(e.kind, x.astype(np.float32), cfg)))
  ignored = sorted(original for n, original in names.items()
                   if n not in used and n not in _TIED_OR_BUFFERS
                   and not n.endswith((".position_ids", ".token_type_ids")))
  return params, missing, ignored


def params_to_hf(params: Params, cfg: ModelConfig, heads: tuple[str, ...]
                 ) -> dict[str, np.ndarray]:
  """Our tree -> an HF state dict (float32 numpy) for the class `_HF_CLASSES` names.

  With no heads the names lose the base-model prefix, as a bare `BertModel` saves them; tied
  decoder weights are left out, as transformers itself leaves them out.
  """
  entries = encoder_entries(cfg) + [e for h in heads for e in head_entries(cfg, h)]
  out = {}
  for e in entries:
    x = _to_hf(e.kind, np.asarray(_get(params, e.path), dtype=np.float32), cfg)
    assert tuple(x.shape) == e.shape, (e.hf, x.shape, e.shape)
    name = e.hf if heads else e.hf[len(cfg.architecture) + 1:]
    out[name] = np.ascontiguousarray(x)
  return out


# ----------------------------------------------------------------------------- models


def build_model(cfg: ModelConfig, heads: tuple[str, ...]):
  """The Linen module whose params are {"encoder", *heads}."""
  from bertjax.models.electra import ElectraDiscriminator  # pylint: disable=g-import-not-at-top
  from bertjax.models.encoder import Encoder  # pylint: disable=g-import-not-at-top
  from bertjax.models.pretraining import PretrainingModel  # pylint: disable=g-import-not-at-top
  if not heads:
    return Encoder(cfg)
  if "rtd" in heads:
    return ElectraDiscriminator(cfg)
  return PretrainingModel(cfg, pair_head="pair" in heads)


def _init_fn(cfg: ModelConfig, heads: tuple[str, ...]):
  """A function rng -> unboxed params of {"encoder", *heads} (encoder alone: the Encoder's)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  model = build_model(cfg, heads)
  ids = jnp.zeros((1, 2), jnp.int32)
  # PretrainingModel only creates its MLM head when asked for masked positions.
  kwargs = {"masked_positions": jnp.zeros((1, 1), jnp.int32)} if "mlm" in heads else {}

  def init(rng):
    params = nn.meta.unbox(model.init(rng, ids, **kwargs)["params"])
    return params if heads else {"encoder": params}
  return init


class _TiedEmbeddingStub:
  """Stands in for the encoder when initializing the MLM head alone (it only calls attend)."""

  def __init__(self, vocab_size: int):
    self.vocab_size = vocab_size

  def attend(self, x):
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    return jnp.zeros(x.shape[:-1] + (self.vocab_size,), x.dtype)


def _fresh_part(cfg: ModelConfig, part: str, seed: int) -> Params:
  """Fresh params of one head (or the pooler) from the model's own module and initializers.

  Initializing just that module, rather than the whole model, keeps it to a handful of small
  ops; `_check_tree` later confirms the result fits the full model's tree.
  """
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bertjax.models import layers as layers_lib  # pylint: disable=g-import-not-at-top
  from bertjax.models import heads as heads_lib  # pylint: disable=g-import-not-at-top
  x = jnp.zeros((1, 1, cfg.hidden_size), jnp.float32)
  if part == "pooler":
    # The same constructor call as Encoder.setup's pooler.
    dense = layers_lib._dense  # pylint: disable=protected-access
    module, args = dense(cfg.hidden_size, ("embed", "embed_out"), "pooler", cfg), (x,)
  elif part == "mlm":
    module, args = heads_lib.MLMHead(cfg), (x, _TiedEmbeddingStub(cfg.vocab_size))
  elif part == "pair":
    module, args = heads_lib.PairHead(cfg), (x[:, 0],)
  elif part == "rtd":
    module, args = heads_lib.DiscriminatorHead(cfg), (x,)
  else:
    raise ValueError(f"unknown part {part!r}")
  variables = module.init(jax.random.key(seed), *args)
  return jax.device_get(nn.meta.unbox(variables["params"]))


def abstract_params(cfg: ModelConfig, heads: tuple[str, ...]) -> Params:
  """Shapes (jax.ShapeDtypeStruct) of the tree {"encoder", *heads}, without allocating it."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.eval_shape(_init_fn(cfg, heads), jax.random.key(0))


def _check_tree(params: Params, cfg: ModelConfig, heads: tuple[str, ...], where: str) -> None:
  """Fails unless `params` has exactly the paths and shapes the model expects."""
  import jax  # pylint: disable=g-import-not-at-top
  want = {jax.tree_util.keystr(k): tuple(v.shape)
          for k, v in jax.tree_util.tree_leaves_with_path(abstract_params(cfg, heads))}
  got = {jax.tree_util.keystr(k): tuple(np.shape(v))
         for k, v in jax.tree_util.tree_leaves_with_path(params)}
  for name in sorted(set(want) | set(got)):
    if want.get(name) != got.get(name):
      fail(f"{where}: parameter {name} is {got.get(name, 'missing')}, the model expects "
           f"{want.get(name, 'no such parameter')}; the params do not match model.json")


# ----------------------------------------------------------------------------- reading HF folders


def _one_line(e: BaseException) -> str:
  lines = str(e).strip().splitlines()
  return lines[0] if lines else type(e).__name__


_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
              "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def _read_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  try:
    return load_file(str(path))
  except TypeError:
    pass  # numpy has no bfloat16: parse the (simple) format ourselves below.
  except Exception as e:  # pylint: disable=broad-except
    fail(f"cannot read {path}: {_one_line(e)}; re-download or re-save the checkpoint")
  # Layout: 8-byte little-endian header length, a JSON header, then the raw tensor bytes.
  with open(path, "rb") as f:
    n = int.from_bytes(f.read(8), "little")
    header = json.loads(f.read(n))
    data = f.read()
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    start, end = info["data_offsets"]
    buf = data[start:end]
    if info["dtype"] == "BF16":
      # bfloat16 is the top half of a float32.
      x = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif info["dtype"] in _ST_DTYPES:
      x = np.frombuffer(buf, _ST_DTYPES[info["dtype"]])
    else:
      fail(f"cannot read {path}: tensor {name} has unsupported dtype {info['dtype']}")
    out[name] = x.reshape(info["shape"])
  return out


def _read_torch_bin(path: pathlib.Path) -> dict[str, np.ndarray]:
  """Unpickles a pytorch_model.bin; the one place torch is needed."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    fail(f"{path} is a PyTorch pickle and reading it needs torch, which is not installed; "
         "install torch or save the checkpoint as model.safetensors")
  try:
    state = torch.load(str(path), map_location="cpu", weights_only=True)
  except Exception as e:  # pylint: disable=broad-except
    fail(f"cannot read {path}: {_one_line(e)}; re-download or re-save the checkpoint")
  return {k: (v.float() if v.is_floating_point() else v).numpy() for k, v in state.items()}


def read_hf_config(model_dir: PathLike) -> dict[str, Any]:
  d = pathlib.Path(model_dir)
  if not d.is_dir():
    fail(f"model directory {d} not found; pass --model-dir a Hugging Face model folder")
  path = d / "config.json"
  if not path.is_file():
    fail(f"{path} not found; --model-dir must be a Hugging Face model folder (config.json and "
         "model.safetensors or pytorch_model.bin)")
  try:
    hf = json.loads(path.read_text())
  except (ValueError, OSError) as e:
    fail(f"cannot read {path}: {_one_line(e)}; it must be a transformers config.json")
  if not isinstance(hf, dict):
    fail(f"{path} is not a JSON object; it must be a transformers config.json")
  return hf


def read_hf_weights(model_dir: PathLike) -> dict[str, np.ndarray]:
  """All tensors of a folder: model.safetensors, pytorch_model.bin or their sharded forms."""
  d = pathlib.Path(model_dir)
  for name, reader in (("model.safetensors", _read_safetensors),
                       ("pytorch_model.bin", _read_torch_bin)):
    if (d / name).is_file():
      return reader(d / name)
    index = d / f"{name}.index.json"
    if index.is_file():
      try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
      except (ValueError, KeyError, OSError) as e:
        fail(f"cannot read {index}: {_one_line(e)}; re-download the checkpoint")
      out = {}
      for shard in shards:
        if not (d / shard).is_file():
          fail(f"{d / shard} not found (listed in {index.name}); re-download the checkpoint")
        out.update(reader(d / shard))
      return out
  fail(f"no weights in {d}: expected model.safetensors or pytorch_model.bin next to config.json")


# ----------------------------------------------------------------------------- conversion


@dataclasses.dataclass
class Converted:
  """A model in our format: config, params {"encoder", *heads} (numpy float32) and what the
  conversion did. For ELECTRA `--part both`, `generator` holds the generator network too."""
  config: ModelConfig
  params: Params
  heads: tuple[str, ...]
  missing: tuple[str, ...] = ()
  ignored: tuple[str, ...] = ()
  hf_model_type: str = ""
  part: str | None = None
  generator: "Converted | None" = None


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
  """Converts a Hugging Face folder in memory.

  part: ELECTRA only: "discriminator", "generator", "both" (a folder with discriminator/ and
  generator/ subfolders) or None (detect from the tensors). heads=False keeps only the encoder.
  """
  if part is not None and part not in ELECTRA_PARTS:
    fail(f"unknown part {part!r}; use one of {', '.join(ELECTRA_PARTS)}")
  d = pathlib.Path(model_dir)
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
  want = architecture_heads(cfg.architecture, part) if heads else ()
  if "mlm" in want and hf.get("tie_word_embeddings") is False:
    fail(f"{d / 'config.json'} sets tie_word_embeddings=false; bertjax's MLM decoder is tied to "
         "the word embeddings, so only tied checkpoints convert")
  params, missing, ignored = hf_to_params(sd, cfg, want)
  for i, name in enumerate(missing):
    fresh = _fresh_part(cfg, name, i)
    if name == "pooler":
      params["encoder"]["pooler"] = fresh
    else:
      params[name] = fresh
  params = _to_numpy(params)
  _check_tree(params, cfg, want, str(d))
  return Converted(cfg, params, want, tuple(missing), tuple(ignored), cfg.architecture, part)


def _to_numpy(tree: Any) -> Any:
  if isinstance(tree, Mapping):
    return {k: _to_numpy(v) for k, v in tree.items()}
  return np.asarray(tree, dtype=np.float32)


def _check_target(path: pathlib.Path, flag: str) -> pathlib.Path:
  path = pathlib.Path(path).absolute()
  if path.exists() and (not path.is_dir() or any(path.iterdir())):
    fail(f"{flag} {path} is not empty; choose a new folder or delete it first")
  return path


@contextlib.contextmanager
def _staging_dir(target: pathlib.Path) -> Iterator[pathlib.Path]:
  """A temporary folder beside `target`, renamed to it at the end; removed on any failure."""
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


def _copy_tokenizer(src: pathlib.Path, dst: pathlib.Path) -> list[str]:
  copied = []
  for name in TOKENIZER_FILES:
    if (src / name).is_file():
      dst.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src / name, dst / name)
      copied.append(name)
  return copied


def _save_params(path: pathlib.Path, params: Params) -> None:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(path, params)
  checkpointer.wait_until_finished()


def _model_entry(c: Converted) -> dict[str, Any]:
  return {"model": c.config.to_dict(), "heads": list(c.heads), "missing": list(c.missing)}


def convert_from_hf(model_dir: PathLike, workdir: PathLike, part: str | None = None,
                    log: Callable[[str], Any] = print) -> Converted:
  """Hugging Face folder -> workdir with model.json, params/ and tokenizer/."""
  out = _check_target(pathlib.Path(workdir), "--workdir")
  c = load_hf(model_dir, part)
  params = dict(c.params)
  meta = {**_model_entry(c), "hf_model_type": c.hf_model_type, "part": c.part,
          "source": str(pathlib.Path(model_dir).absolute())}
  if c.generator is not None:
    params["generator"] = c.generator.params
    meta["generator"] = _model_entry(c.generator)
  src = pathlib.Path(model_dir)
  with _staging_dir(out) as tmp:
    _save_params(tmp / "params", params)
    tok_src = src / "discriminator" if c.part == "both" else src
    copied = _copy_tokenizer(tok_src, tmp / "tokenizer")
    (tmp / "model.json").write_text(json.dumps(meta, indent=2) + "\n")
  log(f"converted {c.hf_model_type} checkpoint {model_dir} -> {out} "
      f"(heads: {', '.join(c.heads) or 'none'}"
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
  return c


def load_workdir(workdir: PathLike) -> Converted:
  """Reads a folder written by `convert_from_hf` (model.json + params/)."""
  d = pathlib.Path(workdir).absolute()
  meta_path = d / "model.json"
  if not meta_path.is_file():
    fail(f"{meta_path} not found; pass a folder written by `python -m bertjax.convert from-hf`")
  try:
    meta = json.loads(meta_path.read_text())
    # The kernel set is chosen where the model runs, not where it was written.
    cfg = ModelConfig.from_dict({**meta["model"], "kernels": "auto"})
    heads = tuple(meta["heads"])
  except (ValueError, KeyError, TypeError) as e:
    fail(f"cannot read {meta_path}: {_one_line(e)}; re-run the conversion")
  if not (d / "params").is_dir():
    fail(f"{d / 'params'} not found; re-run the conversion")
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  try:
    params = ocp.StandardCheckpointer().restore(d / "params")
  except Exception as e:  # pylint: disable=broad-except
    fail(f"cannot restore {d / 'params'}: {_one_line(e)}; re-run the conversion")
  params = _to_numpy(params)
  generator = None
  if "generator" in meta:
    gen_cfg = ModelConfig.from_dict({**meta["generator"]["model"], "kernels": "auto"})
    gen_heads = tuple(meta["generator"]["heads"])
    gen_params = params.pop("generator", None)
    if gen_params is None:
      fail(f"{d / 'params'} has no generator tree though model.json lists one; "
           "re-run the conversion")
    _check_tree(gen_params, gen_cfg, gen_heads, str(d / "params") + " [generator]")
    generator = Converted(gen_cfg, gen_params, gen_heads, part="generator",
                          hf_model_type=meta.get("hf_model_type", gen_cfg.architecture))
  _check_tree(params, cfg, heads, str(d / "params"))
  return Converted(cfg, params, heads, tuple(meta.get("missing", ())), (),
                   meta.get("hf_model_type", cfg.architecture), meta.get("part"), generator)


def _hf_heads(c: Converted, log: Callable[[str], Any]) -> tuple[str, ...]:
  """The heads Hugging Face can hold for this architecture, in `_HF_CLASSES` order."""
  heads = tuple(h for h in _HEAD_ORDER if h in c.heads)
  while (c.config.architecture, heads) not in _HF_CLASSES:
    log(f"Hugging Face {c.config.architecture} has no class with heads {', '.join(heads)}; "
        f"leaving out {heads[-1]}")
    heads = heads[:-1]
  return heads


def _write_hf(c: Converted, out: pathlib.Path, tokenizer: pathlib.Path,
              log: Callable[[str], Any]) -> str:
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  cfg = c.config
  heads = _hf_heads(c, log)
  if "mlm" in heads:
    head_act = cfg.mlm_head_act or cfg.hidden_act
    hf_act = "gelu" if cfg.architecture in ("roberta", "electra") else cfg.hidden_act
    if head_act != hf_act:
      fail(f"the MLM head uses {head_act!r} but Hugging Face {cfg.architecture} hard-codes "
           f"{hf_act!r}; this model cannot be exported with its MLM head")
  if cfg.use_pooler and cfg.architecture == "electra":
    log("Hugging Face ELECTRA has no pooler; leaving out encoder/pooler")
  if not cfg.use_pooler and cfg.architecture != "electra":
    log("this model has no pooler; transformers will initialize its pooler fresh")
  cls = _HF_CLASSES[(cfg.architecture, heads)]
  hf_config = model_config_to_hf_config(cfg, [cls])
  tensors = params_to_hf(c.params, cfg, heads)
  out.mkdir(parents=True, exist_ok=True)
  (out / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
  save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
  _copy_tokenizer(tokenizer, out)
  return cls


def convert_to_hf(workdir: PathLike, output: PathLike, log: Callable[[str], Any] = print) -> None:
  """Workdir (model.json + params/) -> Hugging Face folder(s) transformers can load."""
  out = _check_target(pathlib.Path(output), "--output")
  c = load_workdir(workdir)
  tokenizer = pathlib.Path(workdir) / "tokenizer"
  # Validate everything HF cannot express before writing anything.
  model_config_to_hf_config(c.config)
  if c.generator is not None:
    model_config_to_hf_config(c.generator.config)
  with _staging_dir(out) as tmp:
    if c.generator is None:
      cls = _write_hf(c, tmp, tokenizer, log)
      log(f"wrote {cls} to {out}")
    else:
      cls = _write_hf(c, tmp / "discriminator", tokenizer, log)
      gen_cls = _write_hf(c.generator, tmp / "generator", tokenizer, log)
      log(f"wrote {cls} to {out / 'discriminator'} and {gen_cls} to {out / 'generator'}")


# ----------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m bertjax.convert",
                                   description=__doc__.split("\n\n", maxsplit=1)[0])
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("from-hf", help="Hugging Face folder -> bertjax workdir")
  p.add_argument("--model-dir", required=True, help="folder with config.json and model.safetensors")
  p.add_argument("--workdir", required=True, help="new folder to write (must not be non-empty)")
  p.add_argument("--part", choices=ELECTRA_PARTS, default=None,
                 help="ELECTRA: which network the folder holds (default: detect); 'both' reads "
                      "MODEL_DIR/discriminator and MODEL_DIR/generator")
  p = sub.add_parser("to-hf", help="bertjax workdir -> Hugging Face folder")
  p.add_argument("--workdir", required=True, help="folder written by from-hf")
  p.add_argument("--output", required=True, help="new folder to write (must not be non-empty)")
  args = parser.parse_args(argv)
  if args.command == "from-hf":
    convert_from_hf(args.model_dir, args.workdir, args.part)
  else:
    convert_to_hf(args.workdir, args.output)


if __name__ == "__main__":
  run_cli(main)
