"""bertjax: BERT-family encoders (BERT, RoBERTa, ALBERT, ELECTRA) in JAX/Flax.

Load a Hugging Face checkpoint folder (config.json + model.safetensors), a folder written by
`python -m bertjax.convert from-hf`, or a training workdir, and run the encoder:

  import bertjax
  model, params, config = bertjax.from_hf("path/to/bert-base-uncased")   # or bertjax.load(W)
  out = model.apply({"params": params}, input_ids, attention_mask=attention_mask,
                    token_type_ids=token_type_ids, deterministic=True)
  out.last_hidden_state   # <float32>[batch, seq, hidden]
  out.pooler_output       # <float32>[batch, hidden] (None for ELECTRA)

`model` is a `bertjax.models.encoder.Encoder`, `params` its parameter tree and `config` its
`ModelConfig`. `bertjax.load(W)` returns a `bertjax.convert.loading.Loaded`, which unpacks to
those three and also carries the head:

  m = bertjax.load("runs/rte")                 # a fine-tuning workdir (or W/best, or --step)
  m.task.kind, m.task.labels                   # "sequence", ("entailment", "not_entailment")
  m.logits(input_ids, attention_mask, token_type_ids)   # <float32>[batch, num_labels]
  m.head_model.apply({"params": m.head_params}, ...)     # pretraining heads (mlm, pair, rtd)

Imports happen inside the functions so that `import bertjax` stays cheap.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  from bertjax.models.config import ModelConfig
  from bertjax.models.encoder import Encoder

__all__ = ["from_hf", "load"]


def _triple(converted) -> tuple["Encoder", Any, "ModelConfig"]:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bertjax.models.architectures import encoder_for  # pylint: disable=g-import-not-at-top
  params = jax.tree.map(jnp.asarray, converted.params["encoder"])
  return encoder_for(converted.config), params, converted.config


def from_hf(model_dir: str | os.PathLike, part: str | None = None
            ) -> tuple["Encoder", Any, "ModelConfig"]:
  """Converts a Hugging Face folder in memory: returns (Encoder, encoder params, ModelConfig).

  model_dir: a folder with config.json and model.safetensors (or pytorch_model.bin) of a BERT,
  RoBERTa, ALBERT or ELECTRA model. part: for ELECTRA, "discriminator" or "generator" (by
  default detected from the tensors). Pretraining heads are not loaded; use
  `bertjax.convert.load_hf` for them. Raises `bertjax.core.errors.UserError` for unusable input.
  """
  from bertjax import convert  # pylint: disable=g-import-not-at-top
  if part == "both":
    from bertjax.core.errors import fail  # pylint: disable=g-import-not-at-top
    fail("from_hf returns one encoder; pass part='discriminator' or part='generator'")
  return _triple(convert.load_hf(model_dir, part=part, heads=False))


def load(workdir: str | os.PathLike, step: int | None = None):
  """Loads a model folder: one written by from-hf, a pretraining or fine-tuning workdir (its
  newest complete checkpoint, or `step`) or a fine-tuning run's best/ folder.

  Returns a `bertjax.convert.loading.Loaded`: it unpacks to (Encoder, encoder params, config) and
  carries the head (`head_model`, `head_params`, `task`, `logits`). For ELECTRA this is the
  discriminator; the generator is in `.source.converted.generator`.
  """
  from bertjax.convert import loading  # pylint: disable=g-import-not-at-top
  return loading.load(workdir, step)
