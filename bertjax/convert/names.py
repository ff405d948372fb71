"""Which of our parameters each Hugging Face tensor is, and the layout changes between them."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

import numpy as np

from bertjax.core.errors import fail
from bertjax.models.config import ModelConfig
from bertjax.models.encoder import has_embedding_projection

Params = dict[str, Any]

# ----------------------------------------------------------------------------- name mapping


@dataclasses.dataclass(frozen=True)
class Entry:
  """One tensor: its Hugging Face name, our param path, layout `kind` and HF shape.

  kinds: "copy" (same array), "linear" (torch [out, in] <-> our kernel [in, out]), "qkv_kernel"
  ([heads*head_dim, hidden] <-> [hidden, heads, head_dim]), "qkv_bias" ([heads*head_dim] <->
  [heads, head_dim]), "attn_out_kernel" ([hidden, heads*head_dim] <-> [heads, head_dim, hidden]);
  ModernBERT's "qkv_fused_kernel" ([3*heads*head_dim, hidden] <-> [hidden, 3, heads, head_dim]),
  "qkv_fused_bias", "glu_kernel" ([2*mlp, hidden] <-> [hidden, 2, mlp]) and "glu_bias".
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


def base_prefix(architecture: str) -> str:
  """The prefix of the base model's tensors in a checkpoint with heads: "bert.", ..., "model."
  (ModernBERT)."""
  return "model." if architecture == "modernbert" else architecture + "."


def modernbert_entries(cfg: ModelConfig) -> list[Entry]:
  """ModernBERT's encoder tensors (transformers' ModernBertModel under "model."). Biases only
  where the config has them; layer 0 has no attn_norm."""
  p, hidden, inter = "model.", cfg.hidden_size, cfg.intermediate_size
  width = cfg.num_attention_heads * cfg.head_dim

  def norm(hf, path):
    res = [Entry(hf + ".weight", path + ("scale",), "copy", (hidden,), "encoder")]
    return res + ([Entry(hf + ".bias", path + ("bias",), "copy", (hidden,), "encoder")]
                  if cfg.norm_bias else [])

  def linear(hf, path, kinds, out, inp, bias):
    res = [Entry(hf + ".weight", path + ("kernel",), kinds[0], (out, inp), "encoder")]
    return res + ([Entry(hf + ".bias", path + ("bias",), kinds[1], (out,), "encoder")]
                  if bias else [])

  emb = ("encoder", "embeddings")
  out = [Entry(p + "embeddings.tok_embeddings.weight", emb + ("tok_embeddings", "embedding"),
               "copy", (cfg.vocab_size, hidden), "encoder"),
         *norm(p + "embeddings.norm", emb + ("norm",))]
  for i in range(cfg.num_hidden_layers):
    b, path = f"{p}layers.{i}.", ("encoder", f"layer_{i}")
    if i:
      out += norm(b + "attn_norm", path + ("attn_norm",))
    out += linear(b + "attn.Wqkv", path + ("attn", "Wqkv"), ("qkv_fused_kernel", "qkv_fused_bias"),
                  3 * width, hidden, cfg.attention_bias)
    out += linear(b + "attn.Wo", path + ("attn", "Wo"), ("attn_out_kernel", "copy"), hidden, width,
                  cfg.attention_bias)
    out += norm(b + "mlp_norm", path + ("mlp_norm",))
    out += linear(b + "mlp.Wi", path + ("mlp", "Wi"), ("glu_kernel", "glu_bias"), 2 * inter,
                  hidden, cfg.mlp_bias)
    out += linear(b + "mlp.Wo", path + ("mlp", "Wo"), ("linear", "copy"), hidden, inter,
                  cfg.mlp_bias)
  return out + norm(p + "final_norm", ("encoder", "final_norm"))


def modernbert_mlm_entries(cfg: ModelConfig) -> list[Entry]:
  """ModernBertForMaskedLM's head: `head.dense`, `head.norm` and the decoder's own bias (its
  weight is the token table, tied)."""
  hidden = cfg.hidden_size
  out = [Entry("head.dense.weight", ("mlm", "dense", "kernel"), "linear", (hidden, hidden), "mlm")]
  if cfg.classifier_bias:
    out.append(Entry("head.dense.bias", ("mlm", "dense", "bias"), "copy", (hidden,), "mlm"))
  out.append(Entry("head.norm.weight", ("mlm", "norm", "scale"), "copy", (hidden,), "mlm"))
  if cfg.norm_bias:
    out.append(Entry("head.norm.bias", ("mlm", "norm", "bias"), "copy", (hidden,), "mlm"))
  if cfg.decoder_bias:
    out.append(Entry("decoder.bias", ("mlm", "bias"), "copy", (cfg.vocab_size,), "mlm"))
  return out


def encoder_entries(cfg: ModelConfig) -> list[Entry]:
  """The encoder's tensors, HF names with the base-model prefix ("bert.", "albert.", ...)."""
  if cfg.architecture == "modernbert":
    return modernbert_entries(cfg)
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
    width = cfg.layer_heads(g) * cfg.head_dim  # a pruned layer's heads are fewer
    res = []
    for proj in ("query", "key", "value"):
      res += [Entry(names[proj] + ".weight", att + (proj, "kernel"), "qkv_kernel", (width, hidden),
                    "encoder"),
              Entry(names[proj] + ".bias", att + (proj, "bias"), "qkv_bias", (width,), "encoder")]
    res += [Entry(names["attn_out"] + ".weight", att + ("output", "kernel"), "attn_out_kernel",
                  (hidden, width), "encoder"),
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
                    "predictions.decoder.bias", "generator_lm_head.weight", "decoder.weight")


def head_entries(cfg: ModelConfig, head: str) -> list[Entry]:
  t, hidden, e_size = cfg.architecture, cfg.hidden_size, cfg.embed_size
  if head == "mlm" and t == "modernbert":
    return modernbert_mlm_entries(cfg)
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


# Task heads (fine-tuning): our top-level name -> the Hugging Face prefix of its linear layer.
TASK_HEADS = {"sequence": ("classifier", "classifier"), "token": ("classifier", "classifier"),
              "qa": ("qa_outputs", "qa_outputs")}


def task_head_entries(cfg: ModelConfig, kind: str, num_labels: int) -> list[Entry]:
  """The linear layer of a fine-tuning head ("sequence", "token" or "qa"); RoBERTa's sequence
  classifier is `classifier.out_proj` (our pooler is its `classifier.dense`, see
  `roberta_classifier_dense`)."""
  ours, hf = TASK_HEADS[kind]
  if cfg.architecture == "modernbert":
    return modernbert_task_entries(cfg, ours, num_labels)
  if kind == "sequence" and cfg.architecture == "roberta":
    hf = "classifier.out_proj"
  return _linear(hf, (ours, "classifier"), num_labels, cfg.hidden_size, ours)


def modernbert_task_entries(cfg: ModelConfig, ours: str, num_labels: int) -> list[Entry]:
  """ModernBertFor{SequenceClassification,TokenClassification,QuestionAnswering}'s head, the same
  in the three: `head.dense`, `head.norm` (our `ours/dense`, `ours/norm`) and `classifier`."""
  hidden = cfg.hidden_size
  out = [Entry("head.dense.weight", (ours, "dense", "kernel"), "linear", (hidden, hidden), ours)]
  if cfg.classifier_bias:
    out.append(Entry("head.dense.bias", (ours, "dense", "bias"), "copy", (hidden,), ours))
  out.append(Entry("head.norm.weight", (ours, "norm", "scale"), "copy", (hidden,), ours))
  if cfg.norm_bias:
    out.append(Entry("head.norm.bias", (ours, "norm", "bias"), "copy", (hidden,), ours))
  return out + _linear("classifier", (ours, "classifier"), num_labels, hidden, ours)


def roberta_classifier_dense(cfg: ModelConfig) -> list[Entry]:
  """Our pooler (dense + tanh on <s>) as RobertaClassificationHead's dense layer."""
  return _linear("classifier.dense", ("encoder", "pooler"), cfg.hidden_size, cfg.hidden_size,
                 "pooler")


def architecture_heads(architecture: str, part: str | None = None) -> tuple[str, ...]:
  """The heads a converted model of this architecture carries (ELECTRA: per network)."""
  if architecture == "electra":
    return ("mlm",) if part == "generator" else ("rtd",)
  return {"bert": ("mlm", "pair"), "roberta": ("mlm",), "albert": ("mlm", "pair"),
          "modernbert": ("mlm",)}[architecture]


def tensor_to_ours(kind: str, x: np.ndarray, cfg: ModelConfig) -> np.ndarray:
  # The head count is the tensor's own (-1): a pruned layer has fewer heads.
  head_dim, hidden = cfg.head_dim, cfg.hidden_size
  if kind == "linear":
    return x.T
  if kind == "qkv_kernel":
    return x.T.reshape(hidden, -1, head_dim)
  if kind == "qkv_bias":
    return x.reshape(-1, head_dim)
  if kind == "attn_out_kernel":
    return x.T.reshape(-1, head_dim, hidden)
  # ModernBERT's fused q/k/v rows are [3, heads, head_dim]; GeGLU's Wi rows [2 (input, gate), mlp].
  if kind == "qkv_fused_kernel":
    return x.T.reshape(hidden, 3, -1, head_dim)
  if kind == "qkv_fused_bias":
    return x.reshape(3, -1, head_dim)
  if kind == "glu_kernel":
    return x.T.reshape(hidden, 2, -1)
  if kind == "glu_bias":
    return x.reshape(2, -1)
  return x


def tensor_to_hf(kind: str, x: np.ndarray, cfg: ModelConfig) -> np.ndarray:
  hidden = cfg.hidden_size
  if kind == "linear":
    return x.T
  if kind == "qkv_kernel":
    return x.reshape(hidden, -1).T
  if kind == "qkv_bias":
    return x.reshape(-1)
  if kind == "attn_out_kernel":
    return x.reshape(-1, hidden).T
  if kind in ("qkv_fused_kernel", "glu_kernel"):
    return x.reshape(hidden, -1).T
  if kind in ("qkv_fused_bias", "glu_bias"):
    return x.reshape(-1)
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
  prefix = base_prefix(architecture)
  out = {}
  for original in names:
    name = original
    if name.split(".")[0] in ("embeddings", "encoder", "pooler", "embeddings_project", "layers",
                              "final_norm"):
      name = prefix + name
    if name.endswith(".gamma"):
      name = name[:-len("gamma")] + "weight"
    elif name.endswith(".beta"):
      name = name[:-len("beta")] + "bias"
    out[name] = original
  return out


def hf_to_params(state_dict: Mapping[str, np.ndarray], cfg: ModelConfig,
                 heads: tuple[str, ...], entries: list[Entry] | None = None
                 ) -> tuple[Params, list[str], list[str]]:
  """Maps an HF state dict onto our tree {"encoder": ..., <heads present>...} (float32 numpy).

  Returns (params, missing, ignored): `missing` names the heads (and "pooler") the checkpoint
  lacks, `ignored` the checkpoint tensors nothing maps to. Any encoder tensor missing, or any
  tensor with the wrong shape, is a UserError naming it. `entries` replaces the default list
  (the encoder's and the heads').
  """
  names = _normalize_names(state_dict, cfg.architecture)
  used: set[str] = set()
  params: Params = {}
  groups: dict[str, list[Entry]] = {}
  if entries is None:
    entries = encoder_entries(cfg) + [e for h in heads for e in head_entries(cfg, h)]
  for e in entries:
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
      _set(params, e.path, np.ascontiguousarray(tensor_to_ours(e.kind, x.astype(np.float32), cfg)))
  ignored = sorted(original for n, original in names.items()
                   if n not in used and n not in _TIED_OR_BUFFERS
                   and not n.endswith((".position_ids", ".token_type_ids")))
  return params, missing, ignored


def params_to_hf(params: Params, cfg: ModelConfig, heads: tuple[str, ...],
                 entries: list[Entry] | None = None) -> dict[str, np.ndarray]:
  """Our tree -> an HF state dict (float32 numpy) for the class `HF_CLASSES` names.

  With no heads the names lose the base-model prefix, as a bare `BertModel` saves them; tied
  decoder weights are left out, as transformers itself leaves them out. `entries` replaces the
  default list (the encoder's and the heads').
  """
  if entries is None:
    entries = encoder_entries(cfg) + [e for h in heads for e in head_entries(cfg, h)]
  out = {}
  for e in entries:
    x = tensor_to_hf(e.kind, np.asarray(_get(params, e.path), dtype=np.float32), cfg)
    assert tuple(x.shape) == e.shape, (e.hf, x.shape, e.shape)
    name = e.hf if heads else e.hf[len(base_prefix(cfg.architecture)):]
    out[name] = np.ascontiguousarray(x)
  return out
