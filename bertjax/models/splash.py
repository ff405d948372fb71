"""Self-attention through JAX's splash attention kernel (Pallas, TPU), for the TPU kernel set.

`splash_attention` takes the encoder's layout, <T>[batch, seq, heads, head_dim], and its masks:
padding (`attention_mask`) and packed rows (`segment_ids`, 0 = padding) both become the kernel's
segment ids over a full, non-causal mask. Its speed on a TPU is unmeasured, and it has not yet
run on one: interpret mode checks the kernel's arithmetic and masking, not its Mosaic compile
(head sizes other than 128, say).

Off a TPU the kernel runs in Pallas's TPU interpret mode (`pltpu.InterpretParams`): a correctness
check on the CPU, far slower than XLA's attention. That interpreter (jax 0.10.2) does not take the
grid dimension `jax.vmap` adds to a kernel, so there the batch rows run one after another
(`lax.map`); on a TPU they are vmapped into the kernel's grid.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

from bertjax.models import kernels
from bertjax.models.attention_kernel import AttentionKernel

Array = jax.Array

# The kernel's sequence tiles: the key block must be a multiple of 128 lanes, so sequences are
# padded up to a multiple of 128. The largest of these dividing the padded length is taken
# (unmeasured on a TPU; 512 is what JAX's own splash tests and MaxText use for long sequences).
LANES = 128
BLOCKS = (512, 256, 128)


def interpret_here() -> bool:
  """Whether the kernel must run interpreted: anywhere but a TPU (or a build for one,
  `kernels.lowering_for("tpu")`)."""
  return kernels.backend() != "tpu"


def padded_length(seq_len: int) -> int:
  return -(-seq_len // LANES) * LANES


def block_size(seq_len: int) -> int:
  """The largest of BLOCKS that divides `seq_len` (a multiple of 128)."""
  return next(b for b in BLOCKS if seq_len % b == 0)


def _kernel(num_heads: int, seq_len: int, interpret: bool, window: int | None = None):
  """The kernel for [heads, seq_len, head_dim] operands: every query sees every key (`window`
  None) or the keys within `window` positions on either side (ModernBERT's local layers: the
  kernel's own LocalMask, which skips the blocks outside it), the segment ids doing the rest.
  Built at each trace (it holds arrays, which a cache would leak out of the trace that made
  them)."""
  b = block_size(seq_len)
  blocks = kernel_lib.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
                                 block_kv_dkv=b, block_kv_dkv_compute=b, block_q_dq=b,
                                 block_kv_dq=b)
  shape = (seq_len, seq_len)
  one = (mask_lib.FullMask(shape) if window is None
         else mask_lib.LocalMask(shape, window_size=(window, window), offset=0))
  mask = mask_lib.MultiHeadMask([one] * num_heads)
  return kernel_lib.make_splash_mha(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1,
                                    interpret=pltpu.InterpretParams() if interpret else False)


def segments_for(seq_len: int, batch: int, segment_ids: Array | None,
                 attention_mask: Array | None) -> tuple[Array, Array]:
  """(query ids, key ids), <int32>[batch, seq_len]: query i sees key j when their ids match.

  Real keys carry their example's id (1 in unpacked rows), padding keys 0. Unpacked rows: every
  query is 1, so padding queries see the real keys, as the explicit path's mask has them.
  Packed rows: queries carry their keys' ids, so a padding query sees the padding keys (some row
  to normalize over; its output is not any real token's).
  """
  real = (jnp.ones((batch, seq_len), bool) if attention_mask is None
          else jnp.asarray(attention_mask).astype(bool))
  if segment_ids is None:
    return jnp.ones((batch, seq_len), jnp.int32), real.astype(jnp.int32)
  ids = jnp.where(real, jnp.asarray(segment_ids), 0).astype(jnp.int32)
  return ids, ids


def _rows(q: Array, k: Array, v: Array, q_ids: Array, kv_ids: Array, interpret: bool,
          window: int | None = None) -> Array:
  """The kernel over a batch: <T>[batch, heads, seq, head_dim] operands, ids <int32>[batch, seq]
  (seq a multiple of 128)."""
  kernel = _kernel(q.shape[1], q.shape[2], interpret, window)
  one = lambda q, k, v, qi, ki: kernel(q, k, v, kernel_lib.SegmentIds(q=qi, kv=ki))
  if interpret:
    return jax.lax.map(lambda xs: one(*xs), (q, k, v, q_ids, kv_ids))
  return jax.vmap(one)(q, k, v, q_ids, kv_ids)


def _mesh_specs(batch: int, heads: int):
  """PartitionSpecs ([batch, seq, heads, head_dim], [batch, seq]) for a shard_map over the mesh
  in context, from the logical rules of `act_batch` and `heads` (a Pallas TPU kernel is not
  partitioned by XLA), or None without a mesh. A dimension the mesh axes do not divide stays
  whole on every device."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return None
  spec = nn.logical_to_mesh_axes(("act_batch", None, "heads", None))

  def fits(axes, size):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    return axes if names and size % math.prod(mesh.shape[a] for a in names) == 0 else None
  batch_axes, head_axes = fits(spec[0], batch), fits(spec[2], heads)
  return (jax.sharding.PartitionSpec(batch_axes, None, head_axes, None),
          jax.sharding.PartitionSpec(batch_axes, None))


def splash_attention(q: Array, k: Array, v: Array, *, segment_ids: Array | None = None,
                     attention_mask: Array | None = None, interpret: bool = False,
                     window: int | None = None) -> Array:
  """softmax(q.k / sqrt(head_dim)) v through the splash kernel.

  q, k, v: <T>[batch, seq, heads, head_dim] (self-attention: one length). segment_ids:
  <int>[batch, seq], each token's example in packed rows (0 = padding), or None; attention_mask:
  <int or bool>[batch, seq], 1 at real tokens, or None (all real). Returns <T>[batch, seq, heads,
  head_dim]; at real tokens, what `explicit_attention` gives with `make_attention_mask`'s mask.
  The sequence is padded to a multiple of 128 with keys no real query sees, then sliced back.
  `interpret`: run in Pallas's TPU interpret mode (off a TPU). `window`: each query sees only the
  keys within that many positions on either side (None: no limit).
  """
  batch, seq_len, heads, head_dim = q.shape
  if k.shape != q.shape or v.shape != q.shape:
    raise ValueError(f"splash_attention takes q, k, v of one shape; got {q.shape}, {k.shape}, "
                     f"{v.shape}")
  q_ids, kv_ids = segments_for(seq_len, batch, segment_ids, attention_mask)
  pad = padded_length(seq_len) - seq_len
  tokens = lambda x: jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
  ids = lambda x: jnp.pad(x, ((0, 0), (0, pad)))  # padded positions: id 0, unseen by real queries
  q = q * jnp.asarray(1.0 / math.sqrt(head_dim), q.dtype)
  run = lambda q, k, v, qi, ki: _rows(tokens(q), tokens(k), tokens(v), ids(qi), ids(ki),
                                      interpret, window).transpose(0, 2, 1, 3)[:, :seq_len]
  specs = _mesh_specs(batch, heads)
  if specs is None:
    return run(q, k, v, q_ids, kv_ids)
  qkv_spec, ids_spec = specs
  return jax.shard_map(run, in_specs=(qkv_spec,) * 3 + (ids_spec,) * 2, out_specs=qkv_spec,
                       check_vma=False)(q, k, v, q_ids, kv_ids)


def _applies(head_dim: int, dtype, q_len: int, k_len: int, tokens: bool,
             cudnn: bool | None = None) -> bool:
  """Queries at every key's position (gathered queries would be padded to a 128-row tile for a
  few rows) and a mask that carries the tokens and segment ids; any float dtype."""
  del head_dim, dtype, cudnn
  return q_len == k_len and tokens


def _run(q: Array, k: Array, v: Array, mask, deterministic: bool = True, row_multiple: int = 1,
         window: int | None = None) -> Array:
  del deterministic, row_multiple  # no dropout inside; one length
  return splash_attention(q, k, v, segment_ids=mask.q_segments, attention_mask=mask.tokens,
                          interpret=interpret_here(), window=window)


# The TPU set's attention (`bertjax.models.attention.KERNELS`); it takes ModernBERT's local window
# as its own LocalMask.
KERNEL = AttentionKernel("splash", reads=("tokens",), platforms=("tpu",), applies=_applies,
                         run=_run, windowed=True)
