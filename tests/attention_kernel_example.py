"""A new attention kernel as a newcomer would add one: this module, and one entry in
`bertjax.models.attention.KERNELS` (tests/test_attention_kernels.py makes that entry).

The kernel is the explicit path under a new name, counting its calls, so that a test can see the
encoders reach it through the one interface and compare its output with XLA's kernel.
"""

import jax

from bertjax.models import attention
from bertjax.models.attention_kernel import AttentionKernel

CALLS = []


def _run(q, k, v, mask, deterministic=True, row_multiple=1, window=None):
  CALLS.append((q.shape, window))
  return attention.explicit_attention(q, k, v, mask.keys, lambda p: p)[0]


KERNEL = AttentionKernel("explicit-example", reads=(), platforms=("cpu", "gpu", "tpu"),
                         applies=lambda *args, **kwargs: True, run=_run)
