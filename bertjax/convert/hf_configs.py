"""Hugging Face config.json <-> our ModelConfig, and the names of the architectures' classes."""

from __future__ import annotations

from typing import Any, Mapping

from bertjax.core.errors import UserError, fail
from bertjax.data import tokenizers
from bertjax.models.config import ACTIVATIONS, ModelConfig


HF_MODEL_TYPES = ("bert", "roberta", "albert", "electra", "modernbert")
# Every tokenizer file name bertjax reads, ours and transformers' (one table: the tokenizers'
# KIND_FILES, which loading reads too).
TOKENIZER_FILES = tokenizers.TOKENIZER_FILES
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
HF_CLASSES: dict[tuple[str, tuple[str, ...]], str] = {
    ("bert", ("mlm", "pair")): "BertForPreTraining", ("bert", ("mlm",)): "BertForMaskedLM",
    ("bert", ("pair",)): "BertForNextSentencePrediction", ("bert", ()): "BertModel",
    ("roberta", ("mlm",)): "RobertaForMaskedLM", ("roberta", ()): "RobertaModel",
    ("albert", ("mlm", "pair")): "AlbertForPreTraining", ("albert", ("mlm",)): "AlbertForMaskedLM",
    ("albert", ()): "AlbertModel",
    ("electra", ("rtd",)): "ElectraForPreTraining", ("electra", ("mlm",)): "ElectraForMaskedLM",
    ("electra", ()): "ElectraModel",
    ("modernbert", ("mlm",)): "ModernBertForMaskedLM", ("modernbert", ()): "ModernBertModel",
}
HEAD_ORDER = ("mlm", "pair", "rtd")
# The class a fine-tuned model is saved as, by architecture and task head kind (absent: no
# transformers class computes what our head computes).
TASK_CLASSES: dict[tuple[str, str], str] = {
    ("bert", "sequence"): "BertForSequenceClassification",
    ("bert", "token"): "BertForTokenClassification", ("bert", "qa"): "BertForQuestionAnswering",
    ("roberta", "sequence"): "RobertaForSequenceClassification",
    ("roberta", "token"): "RobertaForTokenClassification",
    ("roberta", "qa"): "RobertaForQuestionAnswering",
    ("albert", "sequence"): "AlbertForSequenceClassification",
    ("albert", "token"): "AlbertForTokenClassification",
    ("albert", "qa"): "AlbertForQuestionAnswering",
    ("electra", "token"): "ElectraForTokenClassification",
    ("electra", "qa"): "ElectraForQuestionAnswering",
    ("modernbert", "sequence"): "ModernBertForSequenceClassification",
    ("modernbert", "token"): "ModernBertForTokenClassification",
    ("modernbert", "qa"): "ModernBertForQuestionAnswering",
}
# The classes whose base model keeps its pooler (the others are built with add_pooling_layer=False).
POOLER_CLASSES = frozenset({
    "BertModel", "BertForPreTraining", "BertForNextSentencePrediction",
    "BertForSequenceClassification", "AlbertModel", "AlbertForPreTraining",
    "AlbertForSequenceClassification", "RobertaModel"})


# ----------------------------------------------------------------------------- configs


def hf_config_to_model_config(hf: Mapping[str, Any]) -> ModelConfig:
  """A transformers config.json (as a dict) -> our ModelConfig; unsupported settings fail, and so
  do values of the wrong kind (a hand-edited `"hidden_size": "32"`), in one line naming the file."""
  try:
    return _to_model_config(hf)
  except UserError as e:  # ModelConfig names its fields model.<key>; config.json's are <key>
    fail(f"config.json: {str(e).removeprefix('model.')}")


def _to_model_config(hf: Mapping[str, Any]) -> ModelConfig:
  model_type = hf.get("model_type")
  if model_type not in HF_MODEL_TYPES:
    fail(f"unknown architecture {model_type!r}; supported: {', '.join(HF_MODEL_TYPES)} "
         "(the model_type in config.json)")
  if model_type == "modernbert":
    return modernbert_model_config(hf)
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
  fields["pruned_heads"] = _pruned_heads_from_hf(d.get("pruned_heads") or {},
                                                 d["num_hidden_layers"], model_type)
  return ModelConfig.from_dict(fields)  # checks each value's kind first


# ModernBertConfig's keys that ModelConfig holds under the same name, and the values
# ModernBertConfig gives those a config.json leaves out.
MODERNBERT_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "max_position_embeddings", "pad_token_id", "hidden_activation", "norm_eps", "norm_bias",
    "attention_bias", "mlp_bias", "decoder_bias", "classifier_activation", "classifier_bias",
    "global_rope_theta", "local_rope_theta", "global_attn_every_n_layers", "local_attention",
    "attention_dropout", "embedding_dropout", "mlp_dropout", "initializer_range",
    "initializer_cutoff_factor", "classifier_pooling", "classifier_dropout")
_MODERNBERT_DEFAULTS = dict(vocab_size=50368, hidden_size=768, num_hidden_layers=22,
                            num_attention_heads=12, intermediate_size=1152,
                            max_position_embeddings=8192, pad_token_id=50283)


def modernbert_model_config(hf: Mapping[str, Any]) -> ModelConfig:
  """A transformers ModernBertConfig (config.json as a dict) -> our ModelConfig, field for field."""
  d = {**_MODERNBERT_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
  if d.get("local_rope_theta", 0) is None:  # transformers: the global base then
    d["local_rope_theta"] = d.get("global_rope_theta", 160000.0)
  if (d.get("rope_scaling") or {}).get("rope_type", "default") != "default":
    fail(f"rope_scaling={d['rope_scaling']!r} is not supported; only default rotary embeddings")
  fields = {k: d[k] for k in MODERNBERT_FIELDS if k in d}
  for act in ("hidden_activation", "classifier_activation"):
    if act in fields:
      fields[act] = _ACT_ALIASES.get(fields[act], fields[act])
  return ModelConfig.from_dict(dict(architecture="modernbert", use_pooler=False,
                                    type_vocab_size=1, hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0, **fields))


def modernbert_hf_config(cfg: ModelConfig) -> dict[str, Any]:
  """Our ModernBERT ModelConfig -> ModernBertConfig's keys (a config.json dict)."""
  return {"model_type": "modernbert", **{k: getattr(cfg, k) for k in MODERNBERT_FIELDS}}


def _pruned_heads_from_hf(pruned: Mapping[Any, Any], layers: int, model_type: str):
  """HF's {layer: [original head numbers]} -> one tuple per layer (() when nothing is pruned)."""
  if not pruned:
    return ()
  if model_type == "albert":
    fail("an ALBERT checkpoint with pruned_heads has per-layer heads in shared layers; "
         "bertjax cannot represent it")
  try:
    by_layer = {int(k): tuple(int(h) for h in v) for k, v in pruned.items()}
  except (TypeError, ValueError):
    fail(f"pruned_heads={pruned!r} in config.json is not {{layer: [heads]}}")
  return tuple(by_layer.get(i, ()) for i in range(layers))


def model_config_to_hf_config(cfg: ModelConfig, architectures: list[str] | None = None
                              ) -> dict[str, Any]:
  """Our ModelConfig -> a transformers config.json dict; settings HF cannot express fail."""
  t = cfg.architecture
  if t == "modernbert" and (cfg.pruned_heads or cfg.embed_size != cfg.hidden_size):
    fail("a ModernBERT model with pruned heads or an embedding_size has no Hugging Face "
         "equivalent (ModernBertConfig has neither); use it with bertjax")
  if t == "modernbert":
    return {**modernbert_hf_config(cfg), **({"architectures": list(architectures)}
                                            if architectures else {})}
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
  if t == "albert" and any(cfg.pruned_heads):
    fail("exporting a pruned ALBERT model is not supported; export BERT, RoBERTa or ELECTRA")
  if any(cfg.pruned_heads):
    # transformers prunes these heads (original numbers) when it builds the model, so the saved
    # tensors load with their pruned shapes.
    d["pruned_heads"] = {str(i): list(h) for i, h in enumerate(cfg.pruned_heads) if h}
  return d
