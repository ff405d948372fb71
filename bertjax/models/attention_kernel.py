"""What a fused attention kernel declares, so that the encoders call every kernel one way.

A kernel is an `AttentionKernel` value in a module of its own (the splash kernel's is
`bertjax.models.splash.KERNEL`; XLA's and cuDNN's, both `jax.nn.dot_product_attention`, are in
`bertjax.models.attention`), listed once in `bertjax.models.attention.KERNELS`; a kernel set
(`bertjax.models.kernels`) names the one it uses in its `attention` field. BERT's encoder and
ModernBERT ask `attention.choose` for the kernel of a call and run it: adding a kernel is one
module and one line in that list (tests/test_attention_kernels.py adds one so).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

MASK_FORMS = ("lengths", "tokens")


@dataclasses.dataclass(frozen=True)
class AttentionKernel:
  """One fused attention kernel.

  name: what a kernel set's `attention` field calls it.
  reads: the mask forms it reads besides the boolean `keys` (`attention.AttentionMask`):
    "lengths", right-padded rows as key lengths (built where the set asks for them,
    `Kernels.attention_lengths`); "tokens", the real tokens and packed rows' segment ids.
  platforms: the backends it compiles for natively; elsewhere it runs interpreted or not at all
    (`applies` says which).
  applies: (head_dim, dtype, q_len, k_len, mask, cudnn) -> whether it takes a call; where it does
    not, XLA's attention does. `mask` is the call's `AttentionMask`; `cudnn` whether cuDNN runs
    here (None: find out), for the kernels that depend on it.
  run: (q, k, v, mask, deterministic, row_multiple, window) -> <T>[batch, q, heads, head_dim];
    `window`, the half width of a symmetric local window, is given only where `windowed`.
  windowed: it takes ModernBERT's local window itself; else a local layer goes through XLA.
  """
  name: str
  reads: tuple[str, ...]
  platforms: tuple[str, ...]
  applies: Callable[..., bool]
  run: Callable[..., Any]
  windowed: bool = False

  def __post_init__(self):
    unknown = set(self.reads) - set(MASK_FORMS)
    if unknown:
      raise ValueError(f"attention kernel {self.name!r} reads unknown mask forms {unknown}; "
                       f"the forms are {', '.join(MASK_FORMS)}")
