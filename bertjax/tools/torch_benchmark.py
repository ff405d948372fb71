"""transformers' PyTorch BertForPreTraining (ModernBertForMaskedLM for a ModernBERT model) timed
at bertjax's shapes: the benchmark's reference.

`python -m bertjax.tools.benchmark --compare hf-torch[-compile]` runs this module in its own
process,
    python -m bertjax.tools.torch_benchmark '{"model": {...}, "batch_size": 16, ...}'
which prints one JSON line. It imports no JAX: the process's peak memory is the reference's own
(importing jax and flax would add about 120 MB to it).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
import types

import numpy as np
import torch
import transformers

from bertjax.runtime.host_memory import host_peak_rss_bytes


def reference_model(cfg, seq_len: int, hf_config: dict | None = None):
  """(transformers model, its class name) of `cfg`'s shape, random init, SDPA attention.

  ModernBERT (`hf_config`: bertjax's ModernBertConfig fields, from bertjax.convert): the MLM head
  at the labelled rows only (`sparse_prediction`, as bertjax's head runs at the masked positions)
  and none of transformers' own partial torch.compile (`reference_compile=False`): eager unless
  the whole model is compiled."""
  if getattr(cfg, "architecture", "bert") == "modernbert":
    fields = {k: v for k, v in (hf_config or {}).items() if k != "model_type"}
    if not fields:
      raise ValueError("a ModernBERT reference needs its ModernBertConfig fields (hf_config)")
    fields["max_position_embeddings"] = max(fields["max_position_embeddings"], seq_len)
    hf_cfg = transformers.ModernBertConfig(**fields, sparse_prediction=True,
                                           reference_compile=False)
    cls = transformers.ModernBertForMaskedLM
  else:
    hf_cfg = transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size, hidden_act=cfg.hidden_act,
        hidden_dropout_prob=cfg.hidden_dropout_prob,
        attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
        max_position_embeddings=max(cfg.max_position_embeddings, seq_len),
        type_vocab_size=cfg.type_vocab_size)
    cls = transformers.BertForPreTraining
  return cls._from_config(hf_cfg, attn_implementation="sdpa"), cls.__name__


def reference_batch(cfg, batch_size: int, seq_len: int, num_predictions: int) -> dict:
  """Random tokens, `num_predictions` MLM labels per row (-100 elsewhere), and for BERT token
  types and an NSP label; ModernBERT takes neither."""
  rng = np.random.default_rng(0)
  ids = torch.tensor(rng.integers(5, cfg.vocab_size, (batch_size, seq_len)))
  labels = torch.full((batch_size, seq_len), -100)
  for r in range(batch_size):
    pos = rng.choice(np.arange(1, seq_len), num_predictions, replace=False)
    labels[r, pos] = ids[r, pos]
  batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
  if getattr(cfg, "architecture", "bert") != "modernbert":
    batch.update(token_type_ids=torch.zeros_like(ids),
                 next_sentence_label=torch.tensor(rng.integers(0, 2, batch_size)))
  return batch


def bench_torch(cfg, batch_size: int, seq_len: int, num_predictions: int, steps: int,
                learning_rate: float, compile_model: bool = False,
                hf_config: dict | None = None) -> dict:
  """transformers' BertForPreTraining (or ModernBertForMaskedLM, see `reference_model`) in
  PyTorch at the same shapes: the fair reference.

  On a GPU: bf16 autocast when the bertjax side runs bf16, SDPA attention, fused AdamW, global-norm
  clipping, timed between device synchronizations, peak memory from the CUDA allocator. On a CPU:
  eager float32 (what transformers users run there), peak memory from the process.
  `compile_model`: the model under torch.compile (its compile time reported apart).
  """
  torch.manual_seed(0)
  cuda = torch.cuda.is_available()
  device = torch.device("cuda" if cuda else "cpu")
  model, model_name = reference_model(cfg, seq_len, hf_config)
  model = model.to(device).train()
  opt = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01,
                          **({"fused": True} if cuda else {}))
  forward = torch.compile(model) if compile_model else model
  autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if cuda and cfg.dtype == "bfloat16"
              else contextlib.nullcontext())
  batch = {k: v.to(device) for k, v in
           reference_batch(cfg, batch_size, seq_len, num_predictions).items()}
  sync = torch.cuda.synchronize if cuda else (lambda: None)

  def step():
    opt.zero_grad(set_to_none=True)
    with autocast:
      loss = forward(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()

  t = time.perf_counter()
  step()  # under torch.compile: the compilation
  sync()
  first_s = time.perf_counter() - t
  for _ in range(2):
    step()
  sync()
  times = []
  for _ in range(steps):
    t = time.perf_counter()
    step()
    sync()
    times.append(time.perf_counter() - t)
  step_s = statistics.median(times)
  peak = torch.cuda.max_memory_allocated() if cuda else host_peak_rss_bytes()
  return {"framework": "hf-torch-compile" if compile_model else "hf-torch", "model": model_name,
          "device": torch.cuda.get_device_name() if cuda else "cpu",
          "dtype": "bfloat16 autocast" if cuda and cfg.dtype == "bfloat16" else "float32",
          "tokens_per_s": batch_size * seq_len / step_s, "step_time_s": step_s,
          "first_step_s": first_s, "torch_threads": torch.get_num_threads(),
          "peak_memory_bytes": int(peak), "torch_version": torch.__version__,
          "transformers_version": transformers.__version__}


def main(argv=None) -> dict:
  spec = json.loads((sys.argv[1:] if argv is None else argv)[0])
  result = bench_torch(types.SimpleNamespace(**spec["model"]), spec["batch_size"], spec["seq_len"],
                       spec["num_predictions"], spec["steps"], spec["learning_rate"],
                       spec.get("compile", False), spec.get("hf_config"))
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
