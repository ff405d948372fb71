"""Dropout at the configured rate, in the forms `model.dropout_impl` chooses between.

Every form keeps an element when its random draw is at or above a threshold and scales kept
values by 1 / (1 - rate); like Flax's, the mask is a pure function of the 'dropout' RNG stream.
They differ in how many random bits an element costs and in what the backward pass keeps:

  packed32     one 32-bit word per element, threshold round(rate * 2**32): the drop probability
               is the rate to within 2**-33, closer than float32 holds the rate itself (float32(0.1)
               is 0.1 + 1.5e-9). The backward pass reads the mask packed eight elements a byte. Left
               to autodiff, XLA fused the comparison into the backward pass's consumers and kept
               every layer's random words alive until then (XLA:CPU draws them in a loop it cannot
               fuse): bert-base at batch 8 planned 1231 MB of temporaries instead of 962 MB
               (PERFORMANCE.md). Packing is a reduction, which XLA does not recompute in its
               consumers, so the words die right after the forward pass.
  mask32       the same draws; autodiff keeps the boolean mask (a byte per element).
  bits16       each 32-bit word gives two elements' 16-bit draws (half the random bits), threshold
               round(rate * 2**16): the rate to within 2**-17 (0.1 drops 0.1000061); mask packed
               for the backward pass as in packed32.
  recompute16  the 16-bit draws of bits16; the backward pass keeps only the key and draws the mask
               again, so no mask-sized array outlives the forward pass.

A suffix picks the generator of the draws (none: the layer's key as Flax gives it, threefry unless
JAX_DEFAULT_PRNG_IMPL says otherwise, and the same mask on any mesh):
  +rbg         the layer's key hashed to four words that seed XLA's RngBitGenerator (JAX's "rbg").
  +unsafe_rbg  the layer key's own words seed RngBitGenerator directly, repeated to four as JAX
               seeds its rbg keys: one 4-word hash less per layer than +rbg.
RngBitGenerator's draws are the backend's own: they may differ across backends, XLA versions and
shardings (JAX's documentation of rbg). "flax" is none of these: `nn.Dropout` itself (a boolean
mask from `jax.random.bernoulli`, kept by autodiff), the stock kernel set's choice.
`bertjax.models.kernels` says which form each platform uses and what is measured.

What XLA keeps is its own choice. XLA:CPU's plan for the gradient of 12 layers of
tanh([32768, 256] @ W) each followed by dropout 0.1 (the activations alone: 32 MB a layer) held
per layer: packed32 64 MB, mask32 96, bits16 40, recompute16 91 (XLA:CPU drops the optimization
barrier and draws the backward's mask early), packed32+rbg 33, recompute16+rbg 64. On GPUs and
TPUs, unmeasured.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.core.errors import fail

HALF = 2 ** 16
FORMS = ("packed32", "mask32", "bits16", "recompute16")
GENERATORS = ("rbg", "unsafe_rbg")
IMPLEMENTATIONS = FORMS + tuple(f"{form}+{gen}" for form in FORMS for gen in GENERATORS)
STOCK = "flax"  # nn.Dropout
DROPOUT_SETTINGS = ("auto", STOCK) + IMPLEMENTATIONS  # "auto": the kernel set's choice


def threshold(rate: float, bits: int = 32) -> int:
  """The smallest kept `bits`-bit draw for a drop probability `rate` in [0, 1)."""
  return min(round(rate * 2 ** bits), 2 ** bits - 1)


def keep_mask(rng: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
  """<bool>[*shape]: True where an element is kept, each with probability 1 - rate (32-bit
  draws)."""
  return jax.random.bits(rng, shape, jnp.uint32) >= jnp.uint32(threshold(rate))


def keep_mask16(rng: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
  """<bool>[*shape] from 16-bit draws: the last axis's first half from the low halves of
  ceil(n / 2) words a row, the rest from their high halves."""
  if not shape:
    return keep_mask16(rng, (1,), rate)[0]
  *lead, n = shape
  words = jax.random.bits(rng, (*lead, -(-n // 2)), jnp.uint32)
  draws = jnp.concatenate([words & jnp.uint32(HALF - 1), words >> 16], axis=-1)[..., :n]
  return draws >= jnp.uint32(threshold(rate, 16))


def pack_bits(keep: jax.Array) -> jax.Array:
  """<bool>[..., n] -> <uint8>[..., ceil(n / 8)]: eight mask elements a byte."""
  *lead, n = keep.shape
  keep = jnp.pad(keep, [(0, 0)] * len(lead) + [(0, -n % 8)]).reshape(*lead, -1, 8)
  return jnp.sum(keep.astype(jnp.uint8) << jnp.arange(8, dtype=jnp.uint8), axis=-1,
                 dtype=jnp.uint8)


def unpack_bits(packed: jax.Array, n: int) -> jax.Array:
  """The inverse of `pack_bits` for a last axis of `n`."""
  bits = (packed[..., None] >> jnp.arange(8, dtype=jnp.uint8)) & jnp.uint8(1)
  return bits.reshape(*packed.shape[:-1], -1)[..., :n].astype(bool)


def _scale(x, keep, rate):
  return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - rate), x.dtype), jnp.zeros((), x.dtype))


def _keep(key_data, impl, shape, rate, bits):
  mask = keep_mask if bits == 32 else keep_mask16
  return mask(jax.random.wrap_key_data(key_data, impl=impl), shape, rate)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def packed(x: jax.Array, key_data: jax.Array, rate: float, impl, bits: int) -> jax.Array:
  """x with each element dropped with probability `rate` (the mask from `bits`-bit draws of the
  key of implementation `impl` whose raw words are `key_data`), the rest scaled by
  1 / (1 - rate); the backward pass reads the mask packed eight elements a byte.
  Reverse-mode only (custom VJP)."""
  return _packed_fwd(x, key_data, rate, impl, bits)[0]


def _packed_fwd(x, key_data, rate, impl, bits):
  keep = _keep(key_data, impl, x.shape, rate, bits)
  return _scale(x, keep, rate), pack_bits(keep)


def _packed_bwd(rate, impl, bits, packed_keep, g):
  # None: no cotangent for the integer key words.
  return _scale(g, unpack_bits(packed_keep, g.shape[-1]), rate), None


packed.defvjp(_packed_fwd, _packed_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def recomputed(x: jax.Array, key_data: jax.Array, rate: float, impl) -> jax.Array:
  """`packed` with 16-bit draws whose backward pass keeps only `key_data` and draws the mask
  again. Reverse-mode only (custom VJP)."""
  return _scale(x, _keep(key_data, impl, x.shape, rate, 16), rate)


def _recomputed_fwd(x, key_data, rate, impl):
  return _scale(x, _keep(key_data, impl, x.shape, rate, 16), rate), key_data


def _recomputed_bwd(rate, impl, key_data, g):
  # Tied to g, the second draw cannot be merged with the forward pass's (XLA's CSE would then
  # keep the forward's mask alive, the memory this form exists to save).
  key_data, g = jax.lax.optimization_barrier((key_data, g))
  return _scale(g, _keep(key_data, impl, g.shape, rate, 16), rate), None


recomputed.defvjp(_recomputed_fwd, _recomputed_bwd)


def generator_key(key: jax.Array, generator: str) -> jax.Array:
  """The typed key the mask is drawn from: `key` itself (""), or an rbg key derived from it."""
  if not generator:
    return key
  if generator == "rbg":
    return jax.random.wrap_key_data(jax.random.bits(key, (4,), jnp.uint32), impl="rbg")
  words = jax.random.key_data(key).reshape(-1)
  return jax.random.wrap_key_data(jnp.resize(words, (4,)), impl=generator)


def dropout(x: jax.Array, key: jax.Array, rate: float, implementation: str = "packed32"):
  """x with each element dropped with probability `rate` in [0, 1), the rest scaled by
  1 / (1 - rate), by `implementation` (one of IMPLEMENTATIONS) from the typed key `key`."""
  if implementation not in IMPLEMENTATIONS:
    fail(f"unknown dropout implementation {implementation!r}; use one of "
         f"{', '.join(IMPLEMENTATIONS)}")
  form, _, generator = implementation.partition("+")
  key = generator_key(key, generator)
  data, impl = jax.random.key_data(key), jax.random.key_impl(key)
  if form == "mask32":
    return _scale(x, keep_mask(key, x.shape, rate), rate)
  if form == "recompute16":
    return recomputed(x, data, rate, impl)
  return packed(x, data, rate, impl, 16 if form == "bits16" else 32)


class Dropout(nn.Module):
  """Drop-in for `flax.linen.Dropout(rate)(x, deterministic)`; `implementation`: one of
  IMPLEMENTATIONS (a model's `Layers.dropout` passes its setting, `kernels.dropout_setting`)."""
  rate: float
  implementation: str = "packed32"

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    if deterministic or self.rate == 0.0:
      return x
    if self.rate >= 1.0:
      return jnp.zeros_like(x)
    key = self.make_rng("dropout")
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):  # a raw uint32 PRNGKey
      key = jax.random.wrap_key_data(key)
    return dropout(x, key, self.rate, self.implementation)
