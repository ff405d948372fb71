"""Batch-size warmup: the global batch grows over a run's first tokens, in whole micro-batches.

ModernBERT (Warner et al. 2024) trains its first tokens on a smaller global batch that grows to
the full one (768 to 4608 rows over 50B tokens for the base model). Here a step's batch is k
micro-batches of gradient accumulation: k grows from `start` to `accum` (grad_accum_steps) as
the tokens already trained reach `warmup_tokens`,

  k = min(accum, start + floor((accum - start) * tokens_so_far / warmup_tokens)),

tokens counted as rows x max_seq_length (padding included), so k is a function of the step alone
and a resumed run repeats it. Each step's loss is divided by its own batch's denominators (the
objective's `denominators` of the k micro-batches), so a smaller step is a mean over fewer rows,
not a full-batch sum with rows missing.

The input pipeline yields micro-batches; `GrowingBatches` joins k of them per step, and its state
(the pipeline's and the step reached) resumes exactly. The trainer's step sees a batch whose
leading size differs for each k, so jit compiles it once per distinct k: at most
accum - start + 1 compilations, all during the warmup (each held by jit's cache afterwards).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from bertjax.core.errors import UserError, fail


def check(config, accum: int, task: bool) -> None:
  """The batch warmup's settings against grad_accum_steps (`accum`) and the run's kind."""
  tokens, start = config.get("batch_warmup_tokens", 0), config.get("batch_warmup_start", 1)
  if tokens and task:
    fail(f"batch_warmup_tokens={tokens}: the batch warmup is for pretraining objectives, not "
         "fine-tuning tasks; fix: --config.batch_warmup_tokens=0")
  if tokens and not 1 <= start <= accum:
    fail(f"batch_warmup_start={start} must be in [1, grad_accum_steps={accum}] (micro-batches "
         "per step as the batch warmup starts); fix: --config.batch_warmup_start=1")


def micro_batches_per_step(accum: int, start: int, micro_tokens: int,
                           warmup_tokens: int) -> list[int]:
  """k for each step of the warmup, from the first; every later step runs all `accum`.

  `micro_tokens`: the tokens of one global micro-batch (its rows x max_seq_length)."""
  if not 1 <= start <= accum:
    raise UserError(f"batch_warmup_start={start} must be in [1, grad_accum_steps={accum}]; fix: "
                    "--config.batch_warmup_start=1")
  counts, seen = [], 0
  while warmup_tokens > 0:
    k = min(accum, start + (accum - start) * seen // warmup_tokens)
    if k >= accum:
      break
    counts.append(k)
    seen += k * micro_tokens
  return counts


def step_of_micro_batch(index: int, counts: list[int], accum: int) -> int:
  """The (0-based) step that trains the micro-batch `index` of the stream."""
  done = 0
  for step, k in enumerate(counts):
    done += k
    if index < done:
      return step
  return len(counts) + (index - done) // accum


class GrowingBatches:
  """An iterator of batches of k micro-batches each, k from `counts` (then `accum`)."""

  def __init__(self, micro_batches: Iterator[dict[str, np.ndarray]], counts: list[int],
               accum: int):
    self.micro_batches, self.counts, self.accum = micro_batches, counts, accum
    self.step = 0

  def __iter__(self):
    return self

  def micro_batches_at(self, step: int) -> int:
    return self.counts[step] if step < len(self.counts) else self.accum

  def __next__(self) -> dict[str, np.ndarray]:
    parts = [next(self.micro_batches) for _ in range(self.micro_batches_at(self.step))]
    self.step += 1
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}

  def get_state(self) -> dict[str, Any]:
    return {"micro_batches": self.micro_batches.get_state(), "step": self.step}

  def set_state(self, state: dict[str, Any]) -> None:
    if "micro_batches" not in state:
      raise UserError("the checkpoint's input state is from a run without batch warmup; resume "
                      "with --config.batch_warmup_tokens=0 or start a new workdir")
    self.micro_batches.set_state(state["micro_batches"])
    self.step = int(state["step"])
