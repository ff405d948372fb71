"""Self-attention's inner product: the explicit path and the fused kernels, and the mask forms
each reads. Which one runs is chosen per platform (the model's resolved `bertjax.models.kernels`
set, `attention` and `attention_lengths`, handed down in its `Layers`) and per call
(`output_attentions` needs the explicit path, and so does attention dropout unless
`model.attention_dropout_kernel` picks the Pallas flash kernel).

The fused kernels sit behind one interface (`bertjax.models.attention_kernel.AttentionKernel`):
`KERNELS` lists them by name, `choose` gives the one a call takes, `attend` runs it. XLA's and
cuDNN's (`jax.nn.dot_product_attention`) are declared here, the splash kernel in its module.
"""

from __future__ import annotations

from typing import Callable

import flax
import jax
import jax.numpy as jnp

from bertjax.models import kernels, splash
from bertjax.models.attention_kernel import AttentionKernel
from bertjax.models.flash_attention import dropout_seed, flash_attention

Array = jax.Array


@flax.struct.dataclass
class AttentionMask:
  """Which keys each query sees. keys: <bool>[batch, 1, 1 or q, k]; lengths: <int32>[batch], each
  row's real tokens (what the fused cuDNN kernel takes), or None; right_padded: <bool>[], whether
  every row is ones then zeros, so that the lengths say the same as `keys`. tokens: <int32>[batch,
  k], 1 at real tokens, what the splash kernel takes with the packed rows' `q_segments`, or None
  where the platform's attention is not splash. Packed rows carry q_segments <int32>[batch, q]
  (the segment ids) and kv_segments <int32>[batch, k] (the ids, -1 at padding): a query sees the
  keys of its own id, what the flash kernel reads."""
  keys: Array
  lengths: Array | None = None
  right_padded: Array | None = None
  tokens: Array | None = None
  q_segments: Array | None = None
  kv_segments: Array | None = None


def make_attention_mask(attention_mask: Array, segment_ids: Array | None = None) -> Array:
  """<bool>[batch, 1, q, k]: keys that are real tokens, and of the query's own example when packed.

  Queries at padding positions still see the real keys (as Hugging Face does), so their hidden
  states stay finite and comparable.
  """
  keys = attention_mask.astype(bool)[:, None, None, :]
  if segment_ids is None:
    return keys
  same = segment_ids[:, :, None] == segment_ids[:, None, :]
  return keys & same[:, None, :, :]


def attention_mask_for(chosen: kernels.Kernels, attention_mask: Array,
                       segment_ids: Array | None = None) -> AttentionMask:
  """The mask in the forms the attention kernel of the set `chosen` reads (its `reads`): key
  lengths as well (cuDNN, where the set asks for them), for rows without segments; the tokens and
  segment ids (the splash kernel)."""
  reads = KERNELS[chosen.attention].reads
  keys = make_attention_mask(attention_mask, segment_ids)
  packed = {}
  if segment_ids is not None:
    segments = jnp.asarray(segment_ids, jnp.int32)
    packed = dict(q_segments=segments,
                  kv_segments=jnp.where(attention_mask.astype(bool), segments, -1))
  if "tokens" in reads:
    return AttentionMask(keys, tokens=jnp.asarray(attention_mask).astype(jnp.int32), **packed)
  if segment_ids is not None:
    return AttentionMask(keys, **packed)
  if not (chosen.attention_lengths and "lengths" in reads):
    return AttentionMask(keys)
  real = attention_mask.astype(bool)
  lengths = jnp.sum(real.astype(jnp.int32), axis=-1)
  prefix = jnp.arange(real.shape[-1])[None, :] < lengths[:, None]
  return AttentionMask(keys, lengths, jnp.all(prefix == real))


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def pad_odd_lengths(q: Array, k: Array, v: Array, mask: AttentionMask, multiple: int
                    ) -> tuple[Array, Array, Array, AttentionMask]:
  """q, k, v and the mask with an odd query or key length padded up to a multiple of `multiple`
  (at least 2), what cuDNN's fused kernel needs in training. Padded keys are hidden from every
  query (past every row's length, and False in the boolean mask); padded query rows see every
  key, so they stay finite, and are sliced off by the caller. Even lengths are left alone."""
  q_len, k_len = q.shape[1], k.shape[1]
  multiple = max(multiple, 2)
  q_pad = round_up(q_len, multiple) - q_len if q_len % 2 else 0
  k_pad = round_up(k_len, multiple) - k_len if k_len % 2 else 0
  if not (q_pad or k_pad):
    return q, k, v, mask
  along_seq = lambda x, n: jnp.pad(x, ((0, 0), (0, n), (0, 0), (0, 0)))
  keys = jnp.pad(mask.keys, ((0, 0), (0, 0), (0, 0), (0, k_pad)), constant_values=False)
  if keys.shape[2] > 1:  # a mask per query (packed rows)
    keys = jnp.pad(keys, ((0, 0), (0, 0), (0, q_pad), (0, 0)), constant_values=True)
  return (along_seq(q, q_pad), along_seq(k, k_pad), along_seq(v, k_pad),
          mask.replace(keys=keys))


def _dot_product_attention(implementation: str):
  """The `run` of a kernel of `jax.nn.dot_product_attention` (`implementation` "xla" or
  "cudnn"): softmax(q.k / sqrt(d)) v.

  With key lengths (cuDNN's padding mask; a [batch, 1, 1, k] boolean mask makes cuDNN refuse),
  else with the boolean mask ([batch, 1, q, k] for packed rows, which cuDNN takes as a bias).
  Lengths stand for the mask only on right-padded rows: in inference (`deterministic`) a mask of
  another shape (left padding, holes) is detected and takes XLA's attention with the mask; in
  training the rows come from bertjax's input builders, which all pad on the right.
  For cuDNN, odd query or key lengths are padded up to a multiple of `row_multiple`
  (`pad_odd_lengths`) and the padded rows sliced off: its backward pass refuses odd lengths.
  """
  def run(q: Array, k: Array, v: Array, mask: AttentionMask, deterministic: bool = True,
          row_multiple: int = 1, window: int | None = None) -> Array:
    del window  # not windowed: a local layer takes XLA's own path
    q_len = q.shape[1]
    if implementation == "cudnn":
      q, k, v, mask = pad_odd_lengths(q, k, v, mask, row_multiple)
    if mask.lengths is None:
      out = jax.nn.dot_product_attention(q, k, v, mask=mask.keys, implementation=implementation)
      return out[:, :q_len]
    by_lengths = lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, key_value_seq_lengths=mask.lengths, implementation=implementation)
    if not deterministic:
      return by_lengths(q, k, v)[:, :q_len]
    by_mask = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask.keys,
                                                           implementation="xla")
    return jax.lax.cond(mask.right_padded, by_lengths, by_mask, q, k, v)[:, :q_len]
  return run


def cudnn_available() -> bool:
  """cuDNN's flash attention runs here: an NVIDIA GPU of compute capability 8.0 or newer."""
  if jax.default_backend() not in ("gpu", "cuda"):
    return False
  capability = getattr(jax.devices()[0], "compute_capability", None)
  try:
    return capability is not None and float(capability) >= 8.0
  except (TypeError, ValueError):
    return False


def _cudnn_applies(head_dim: int, dtype, q_len: int, k_len: int, tokens: bool,
                   cudnn: bool | None = None) -> bool:
  """cuDNN runs here (`cudnn`, by default `cudnn_available()`), half precision, head size a
  multiple of 8 up to 128 (odd lengths are padded for it)."""
  del q_len, k_len, tokens
  return bool((cudnn_available() if cudnn is None else cudnn) and not head_dim % 8
              and head_dim <= 128 and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16))


XLA = AttentionKernel("xla", reads=(), platforms=("cpu", "gpu", "tpu"),
                      applies=lambda *args, **kwargs: True, run=_dot_product_attention("xla"))
CUDNN = AttentionKernel("cudnn", reads=("lengths",), platforms=("gpu",), applies=_cudnn_applies,
                        run=_dot_product_attention("cudnn"))

# Every fused attention kernel, by the name a kernel set's `attention` field gives. A new kernel:
# its module with an `AttentionKernel`, and one entry here.
KERNELS: dict[str, AttentionKernel] = {k.name: k for k in (XLA, CUDNN, splash.KERNEL)}


def choose(chosen: kernels.Kernels, head_dim: int, dtype, cudnn: bool | None = None,
           q_len: int = 2, k_len: int = 2, tokens: bool = True) -> AttentionKernel:
  """The kernel a call takes under the set `chosen`: the set's, where it `applies` to the call
  (`tokens`: the mask carries tokens and segment ids), else XLA's."""
  kernel = KERNELS[chosen.attention]
  return kernel if kernel.applies(head_dim, dtype, q_len, k_len, tokens, cudnn) else XLA


def attention_implementation(chosen: kernels.Kernels, head_dim: int, dtype,
                             cudnn: bool | None = None, q_len: int = 2, k_len: int = 2,
                             splash_mask: bool = True) -> str:
  """The name of the kernel `choose` gives (`splash_mask`: the mask carries tokens)."""
  return choose(chosen, head_dim, dtype, cudnn, q_len, k_len, splash_mask).name


def fused_attention(q: Array, k: Array, v: Array, mask: AttentionMask, implementation: str,
                    deterministic: bool = True, row_multiple: int = 1) -> Array:
  """The kernel named `implementation` on the mask as given (every form it holds)."""
  return KERNELS[implementation].run(q, k, v, mask, deterministic, row_multiple)


def attend(kernel: AttentionKernel, q: Array, k: Array, v: Array, mask: AttentionMask,
           deterministic: bool, row_multiple: int, window: int | None = None) -> Array:
  """`kernel` on the call, as the encoders run it: a kernel that reads no other form gets the
  boolean mask alone (lengths are what cuDNN takes, tokens what splash takes); `window` for a
  windowed kernel's local layers."""
  if not kernel.reads:
    mask = AttentionMask(mask.keys)
  return kernel.run(q, k, v, mask, deterministic, row_multiple, window)


def explicit_attention(q: Array, k: Array, v: Array, keys: Array, dropout: Callable[[Array], Array]
                       ) -> tuple[Array, Array]:
  """(output, pre-softmax scores before masking): the path that applies attention dropout and
  hands the scores out (TinyBERT's attention transfer reads them)."""
  raw_scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  scores = jnp.where(keys, raw_scores, jnp.finfo(raw_scores.dtype).min)
  probs = dropout(jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype))
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v), raw_scores


def flash_segments(mask: AttentionMask, q_len: int) -> tuple[Array, Array] | None:
  """(query ids, key ids) that say what `mask` says, for the flash kernel; None where they cannot
  (a per-query mask without segment ids). Unpacked rows: every query 1, real keys 1, padding 0
  (padding queries see the real keys, as on the explicit path)."""
  if mask.q_segments is not None:
    return mask.q_segments, mask.kv_segments
  if mask.keys.shape[2] != 1:
    return None
  keys = mask.keys[:, 0, 0, :]
  return jnp.ones((keys.shape[0], q_len), jnp.int32), keys.astype(jnp.int32)


def flash_dropout_attention(q: Array, k: Array, v: Array, segments: tuple[Array, Array],
                            rate: float, rng: Array) -> Array:
  """The explicit path's output (dropout at `rate` after the softmax) from the Pallas flash
  kernel, its keep mask hashed from `rng` (the layer's dropout key). Interpreted off GPUs."""
  return flash_attention(q, k, v, segment_ids=segments, dropout_rate=rate, seed=dropout_seed(rng),
                         interpret=kernels.triton_interpreted())
