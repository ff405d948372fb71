"""A test double of cuDNN's fused attention: jax's rules for it enforced, XLA's arithmetic.

On a GPU, `jax.nn.dot_product_attention(..., implementation="cudnn")` refuses some calls that
XLA's implementation takes, and some refusals come only in training (the forward rule of its
custom VJP checks more than the primal does). On a CPU the fused kernel never runs, so a model can
pass every test here and crash on its first GPU step. `cudnn_rules()` installs a double that
raises the same errors for the same calls and otherwise computes with XLA, so any bertjax step run
under it with the GPU kernel set behaves as it would on an H100 as far as those rules go.

The rules, as jax 0.10-0.11 states them (`jax/_src/nn/functions.py`, `dot_product_attention`,
and `jax/_src/cudnn/fused_attention_stablehlo.py`, `check_layout` and
`check_is_flash_attention`):
- query, key and value of rank 4 (BTNH), one dtype, float16 or bfloat16;
- head dim a multiple of 8, at most 128 before Hopper and 256 from Hopper on (this double
  enforces `max_head_dim`, 128 by default: the stricter rule, which bertjax keeps everywhere);
- a boolean mask becomes an additive bias, which must be [.., q, k] in its last two axes
  (a [batch, 1, 1, k] key mask is refused: "Bias must have same seq length as QKV");
- sequence lengths int32 of shape [batch];
- a local window with a right side is refused unless causal;
- in training (the VJP's forward rule), query and key lengths must both be even, whatever the
  mask: jax always passes a bias there, an empty one when none was given
  ("Unsupported sequence length Q 21, KV 128").
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp

REAL = jax.nn.dot_product_attention


class Calls:
  """What the double saw: one (q_len, k_len, mask_form) per fused call traced, and the calls
  differentiated (training) among them."""

  def __init__(self):
    self.fused: list[tuple[int, int, str]] = []
    self.trained: list[tuple[int, int]] = []


def check_primal(query, key, value, mask, query_seq_lengths, key_value_seq_lengths,
                 local_window_size, is_causal, max_head_dim: int) -> str:
  """The rules every cuDNN call meets; raises as jax does. Returns the mask form."""
  if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
    raise ValueError(f"Q must have a rank of 4, got {query.ndim}")
  if query.dtype not in (jnp.float16, jnp.bfloat16):
    raise NotImplementedError(f"Q must be fp16/bf16/fp8_e4m3fn/fp8_e5m2, got {query.dtype}")
  if not query.dtype == key.dtype == value.dtype:
    raise ValueError("QKV dtype must be same")
  head_dim = query.shape[-1]
  if head_dim % 8 or head_dim > max_head_dim:
    raise NotImplementedError(f"The head dim must be <= {max_head_dim} and a multiple of 8, "
                              f"but got {head_dim}.")
  q_len, k_len = query.shape[1], key.shape[1]
  if mask is not None:
    if mask.shape[-2] != q_len or mask.shape[-1] != k_len:
      raise ValueError(f"Bias must have same seq length as QKV, got {mask.shape[-2]} and "
                       f"{mask.shape[-1]}")
  for name, lengths in (("q_seqlen", query_seq_lengths), ("kv_seqlen", key_value_seq_lengths)):
    if lengths is not None and (lengths.dtype != jnp.int32 or lengths.shape != query.shape[:1]):
      raise ValueError(f"{name} must be int32 of shape [batch], got {lengths.dtype}"
                       f"{lengths.shape}")
  if local_window_size is not None:
    window = ((local_window_size, local_window_size) if isinstance(local_window_size, int)
              else local_window_size)
    if window[1] != 0 and not is_causal:
      raise ValueError(f"cuDNN doesn't support right window: {window[1]} when causal mask is "
                       "not used.")
  if mask is not None:
    return "bias"
  return "lengths" if key_value_seq_lengths is not None else "none"


def check_training(q_len: int, k_len: int):
  """The rule of the VJP's forward pass: even query and key lengths."""
  if q_len % 2 or k_len % 2:
    raise NotImplementedError(f"Unsupported sequence length Q {q_len}, KV {k_len}.")


def make_double(calls: Calls, max_head_dim: int = 128):
  """A replacement for `jax.nn.dot_product_attention` (see the module docstring)."""

  def double(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
             query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
             implementation=None, **kwargs):
    xla = functools.partial(REAL, scale=scale, is_causal=is_causal,
                            local_window_size=local_window_size, implementation="xla", **kwargs)
    if implementation != "cudnn":
      return xla(query, key, value, bias, mask, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths)
    form = check_primal(query, key, value, mask if mask is not None else bias,
                        query_seq_lengths, key_value_seq_lengths, local_window_size, is_causal,
                        max_head_dim)
    q_len, k_len = query.shape[1], key.shape[1]
    calls.fused.append((q_len, k_len, form))

    @jax.custom_vjp
    def fused(q, k, v):
      return xla(q, k, v, bias, mask, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths)

    def fused_fwd(q, k, v):
      check_training(q.shape[1], k.shape[1])
      calls.trained.append((q.shape[1], k.shape[1]))
      out, vjp = jax.vjp(lambda q, k, v: xla(q, k, v, bias, mask,
                                             query_seq_lengths=query_seq_lengths,
                                             key_value_seq_lengths=key_value_seq_lengths),
                         q, k, v)
      return out, vjp

    def fused_bwd(vjp, g):
      return vjp(g)

    fused.defvjp(fused_fwd, fused_bwd)
    return fused(query, key, value)

  return double


@contextlib.contextmanager
def cudnn_rules(monkeypatch, max_head_dim: int = 128):
  """Within the block: bertjax sees cuDNN as available and every fused call goes to the double.
  Yields the `Calls` record, so a test can show the fused kernel was in fact chosen."""
  from bertjax.models import attention  # pylint: disable=import-outside-toplevel
  calls = Calls()
  monkeypatch.setattr(jax.nn, "dot_product_attention", make_double(calls, max_head_dim))
  monkeypatch.setattr(attention, "cudnn_available", lambda: True)
  yield calls
  monkeypatch.undo()


def install(max_head_dim: int = 128) -> Calls:
  """The double installed for the rest of the process (a subprocess run under it:
  tests/with_cudnn_rules.py); returns its `Calls` record."""
  from bertjax.models import attention  # pylint: disable=import-outside-toplevel
  calls = Calls()
  jax.nn.dot_product_attention = make_double(calls, max_head_dim)
  attention.cudnn_available = lambda: True
  return calls


def fused_forms(calls: Calls) -> set[str]:
  return {form for _, _, form in calls.fused}


def all_even(pairs) -> bool:
  return all(q % 2 == 0 and k % 2 == 0 for q, k, *_ in pairs)

