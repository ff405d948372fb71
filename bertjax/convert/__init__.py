"""Hugging Face interop: checkpoints of BERT, RoBERTa, ALBERT, ELECTRA and ModernBERT, both ways.

  python -m bertjax.convert from-hf --model-dir HF_DIR --workdir OUT \
      [--part discriminator|generator|both]
  python -m bertjax.convert to-hf --workdir W --output HF_DIR [--step N] \
      [--include-untrained-heads mlm,pair]

`from-hf` reads a Hugging Face folder (config.json + model.safetensors or pytorch_model.bin, any
tokenizer files) and writes OUT/model.json, OUT/params/ (an orbax checkpoint of
{"encoder": ..., <heads>...}) and OUT/tokenizer/. `to-hf` writes a folder that
`transformers.AutoModel*.from_pretrained` and `AutoTokenizer.from_pretrained` load, from a
converted folder, a pretraining or fine-tuning workdir (its newest complete checkpoint, or
--step) or a fine-tuning run's best/ folder: the encoder, the trained heads (a task head as
*ForSequenceClassification, *ForTokenClassification or *ForQuestionAnswering, label names in
config.json) and the tokenizer. Heads never trained (initialized fresh by from-hf) are left out
unless --include-untrained-heads names them; the command says what it wrote and left out. The
Python entry points are `load_hf` (in memory), `convert_from_hf`, `convert_to_hf`,
`load_workdir` and `read_source` (any model folder); `bertjax.from_hf` and `bertjax.load` wrap
them.

Heads (names in our param tree):
  mlm  BERT cls.predictions.*, RoBERTa lm_head.*, ALBERT predictions.*,
       ELECTRA generator_predictions.* + generator_lm_head.bias (decoders are tied to the
       word embeddings, as in every released checkpoint)
  pair BERT cls.seq_relationship (NSP), ALBERT sop_classifier.classifier (SOP)
  rtd  ELECTRA discriminator_predictions.*
A head the architecture has but the checkpoint lacks (a bare BertModel, a sentence-embedding
model) is initialized fresh with the model's own init and reported; so is a missing pooler.
model.json records them under "missing", and `to-hf` leaves them out unless named.

Fine-tuning heads (in training workdirs, and in the converted folders `bertjax.prune` writes,
whose model.json names the head under "task"; a head model.json does not name is left out and
said so): GLUE's `classifier` -> *ForSequenceClassification
(`classifier`; RoBERTa: `classifier.dense` is our pooler, `classifier.out_proj` our classifier),
CoNLL's `classifier` -> *ForTokenClassification, SQuAD's `qa_outputs` ->
*ForQuestionAnswering. ModernBERT's task heads (`dense`, `norm`, `classifier`) are its classes'
`head.dense`, `head.norm` and `classifier`; `from-hf` reads a ModernBertFor* fine-tuned class
with its head (model.json "task"), so `bertjax.load` runs it and `to-hf` writes it back.

ELECTRA ships its two networks as separate folders. `--part` picks which one a folder holds
(by default: detected from its tensors); `--part both` takes a folder with `discriminator/` and
`generator/` subfolders and stores the generator's tree under params["generator"].

By concern: `hf_configs` (config.json <-> ModelConfig), `names` (tensor names and layouts),
`models` (the Flax models a tree belongs to), `readers` (safetensors and torch files),
`workdirs` (conversion and converted folders), `sources` (any model folder read for export or
loading), `export` (to-hf), `hf_tokenizer` (tokenizer files for transformers), `__main__` (the
command line). None imports torch
or transformers: safetensors are read with numpy, and torch is imported only to unpickle a
pytorch_model.bin.
"""

from bertjax.convert.hf_configs import (ELECTRA_PARTS, HF_MODEL_TYPES, TOKENIZER_FILES,
                                        hf_config_to_model_config, model_config_to_hf_config)
from bertjax.convert.models import abstract_params, build_model
from bertjax.convert.names import (Entry, architecture_heads, encoder_entries, head_entries,
                                   hf_to_params, params_to_hf, tensor_to_hf, tensor_to_ours)
from bertjax.convert.readers import read_hf_config, read_hf_weights
from bertjax.convert.workdirs import Converted, convert_from_hf, load_hf, load_workdir
from bertjax.convert.sources import Source, TaskHead, read_source
from bertjax.convert.export import convert_to_hf

__all__ = ["ELECTRA_PARTS", "HF_MODEL_TYPES", "TOKENIZER_FILES", "Converted", "Entry",
           "abstract_params", "architecture_heads", "build_model",
           "convert_from_hf", "convert_to_hf", "encoder_entries", "head_entries",
           "hf_config_to_model_config", "hf_to_params", "load_hf", "load_workdir",
           "model_config_to_hf_config", "params_to_hf", "read_hf_config", "read_hf_weights",
           "read_source", "Source", "TaskHead", "tensor_to_hf", "tensor_to_ours"]
