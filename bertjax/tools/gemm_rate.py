"""What the train step's matrix products cost here, in XLA and in PyTorch's BLAS:
`python -m bertjax.tools.benchmark --gemm_rate`.

  python -m bertjax.tools.benchmark --gemm_rate --preset bert-base --batch_size 8 --rounds 3

Compiles the step the benchmark times (its `step_hlo`), reads the 2-D products (`dot`
instructions without batch dimensions: every Dense of the encoder and heads, forward and
backward) out of the optimized HLO, and times each distinct product, with the operand layout
the step gives it, once through XLA (jitted `lax.dot_general`, under this process's XLA_FLAGS)
and once through torch (`@` on the same shapes and transposes), alternately in this one process,
so that both see the same load.
Each time is the median of `rounds` rounds of a few repetitions. The step's products then cost
sum(count * time) on each side. A product timed alone pays one call's overhead (tens of
microseconds on either side) that the step's products do not: products of a few MFLOP read slower
here than they run in a step; bert-base's, of 1-5 GFLOP each, do not.

A CPU comparison against transformers' PyTorch is, for the most part, a comparison of matrix
products: when XLA:CPU's products run slower than PyTorch's on a host (e.g. a Xeon, where torch
calls MKL), the step's ratio falls by as much, whatever the rest of the step does. The attention's
batched products (per head) and everything elementwise are not timed here.
"""

from __future__ import annotations

import collections
import re
import statistics
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.core.errors import fail

# "nn": [m, k] @ [k, n]; "nt": [m, k] @ [n, k]^T (a Dense's input gradient); "tn": [k, m]^T @
# [k, n] (its weight gradient); "tt": both transposed.
FORMS = {((1,), (0,)): "nn", ((1,), (1,)): "nt", ((0,), (0,)): "tn", ((0,), (1,)): "tt"}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\w+)\[([\d,]*)\]")
_DOT = re.compile(r"\sdot\((.*?)\),\s*lhs")
_DIMS = re.compile(r"(lhs|rhs)_(contracting|batch)_dims=\{([\d,]*)\}")


class Product(NamedTuple):
  """One 2-D product C[m, n] = sum_k A[m, k] B[k, n], in the layout `form` gives its operands."""
  m: int
  k: int
  n: int
  form: str
  dtype: str

  @property
  def flops(self) -> int:
    return 2 * self.m * self.k * self.n

  def operand_shapes(self) -> tuple[tuple[int, int], tuple[int, int]]:
    lhs = (self.m, self.k) if self.form[0] == "n" else (self.k, self.m)
    rhs = (self.k, self.n) if self.form[1] == "n" else (self.n, self.k)
    return lhs, rhs


def _dims(text: str) -> tuple[int, ...]:
  return tuple(int(d) for d in text.split(",") if d)


def products(hlo_text: str) -> collections.Counter:
  """Counter[Product]: the 2-D products of an optimized HLO module, each counted once per
  instruction (a product inside a loop body counts once, not once per iteration)."""
  shapes = {}
  for line in hlo_text.splitlines():
    match = _INSTRUCTION.match(line)
    if match:
      shapes[match.group(1)] = (match.group(2), _dims(match.group(3)))
  found = collections.Counter()
  for line in hlo_text.splitlines():
    match, dot = _INSTRUCTION.match(line), _DOT.search(line)
    if not (match and dot):
      continue
    dims = {(side, kind): _dims(value) for side, kind, value in _DIMS.findall(line)}
    if dims.get(("lhs", "batch")) or dims.get(("rhs", "batch")):
      continue  # batched (the attention's per-head products)
    names = re.findall(r"%([\w.\-]+)", dot.group(1))
    if len(names) != 2 or any(name not in shapes for name in names):
      continue
    (dtype, lhs), (_, rhs) = shapes[names[0]], shapes[names[1]]
    contracting = (dims.get(("lhs", "contracting"), ()), dims.get(("rhs", "contracting"), ()))
    form = FORMS.get(contracting)
    if len(lhs) != 2 or len(rhs) != 2 or form is None:
      continue
    m, k = (lhs[0], lhs[1]) if form[0] == "n" else (lhs[1], lhs[0])
    n = rhs[1] if form[1] == "n" else rhs[0]
    found[Product(m, k, n, form, dtype)] += 1
  return found


# HLO's element types and their names in jax.numpy and torch.
DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64"}


def operands(product: Product, torch):
  """(jax arrays, torch tensors): random operands of `product` in its dtype and layout, the
  torch ones transposed as views where its form transposes them."""
  dtype = DTYPES.get(product.dtype)
  if dtype is None:
    fail(f"--gemm_rate: the step multiplies {product.dtype} matrices, which it cannot time; "
         f"it times {', '.join(DTYPES)}")
  rng = np.random.default_rng(0)
  lhs, rhs = (rng.standard_normal(shape, np.float32) for shape in product.operand_shapes())
  ta, tb = (torch.from_numpy(x).to(getattr(torch, dtype)) for x in (lhs, rhs))
  return ((jnp.asarray(lhs, dtype), jnp.asarray(rhs, dtype)),
          (ta if product.form[0] == "n" else ta.T, tb if product.form[1] == "n" else tb.T))


def _timers(product: Product, repeats: int):
  """(xla, torch): each a function timing `repeats` runs of the product and returning the
  median seconds."""
  try:  # torch is not a runtime dependency (requirements-test.txt)
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    fail("--gemm_rate times each product in torch too, which is not installed; "
         "pip install -r requirements-test.txt")
  (a, b), (ta, tb) = operands(product, torch)
  contracting = next(dims for dims, form in FORMS.items() if form == product.form)
  dot = jax.jit(lambda a, b: jax.lax.dot_general(a, b, (contracting, ((), ()))))

  def median_of(run) -> float:
    run()  # warm-up (XLA compiles here)
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      run()
      times.append(time.perf_counter() - start)
    return statistics.median(times)

  return (lambda: median_of(lambda: dot(a, b).block_until_ready()),
          lambda: median_of(lambda: ta @ tb))


def summarize(counts: collections.Counter, xla_s: dict, torch_s: dict, step_flops: float) -> dict:
  """The table and totals from per-product seconds (medians) on each side."""
  rows = [{"m": p.m, "k": p.k, "n": p.n, "form": p.form, "dtype": p.dtype, "count": c,
           "gflop": p.flops / 1e9, "xla_s": xla_s[p], "torch_s": torch_s[p],
           "xla_gflops": p.flops / xla_s[p] / 1e9, "torch_gflops": p.flops / torch_s[p] / 1e9}
          for p, c in sorted(counts.items(), key=lambda pc: -pc[0].flops * pc[1])]
  xla_total = sum(r["count"] * r["xla_s"] for r in rows)
  torch_total = sum(r["count"] * r["torch_s"] for r in rows)
  flops = sum(count * p.flops for p, count in counts.items())
  return {"products": rows, "product_flops": flops, "step_flops": step_flops,
          "share_of_step_flops": flops / step_flops if step_flops else None,
          "xla_s": xla_total, "torch_s": torch_total, "xla_over_torch": xla_total / torch_total}


def measure(config, rounds: int, step_hlo: Callable[[Any], tuple[str, float]],
            repeats: int = 5) -> dict:
  """Per-product and whole-step seconds of the 2-D products of `config`'s train step (its
  optimized HLO and flops: `step_hlo(config)`, bertjax/tools/benchmark.py's), XLA against torch,
  medians of `rounds` alternating rounds."""
  if jax.default_backend() != "cpu":
    fail(f"--gemm_rate compares XLA's and torch's matrix products on the CPU, and this process's "
         f"JAX runs on {jax.default_backend()}; run it with JAX_PLATFORMS=cpu")
  hlo, step_flops = step_hlo(config)
  counts = products(hlo)
  timers = {p: _timers(p, repeats) for p in counts}
  xla_s, torch_s = collections.defaultdict(list), collections.defaultdict(list)
  for _ in range(rounds):
    for product, (xla, torch_) in timers.items():
      xla_s[product].append(xla())
      torch_s[product].append(torch_())
  result = summarize(counts, {p: statistics.median(v) for p, v in xla_s.items()},
                     {p: statistics.median(v) for p, v in torch_s.items()}, step_flops)
  return {**result, "rounds": rounds, "repeats": repeats,
          "device": jax.devices()[0].platform, "batch_size": config.batch_size,
          "seq_len": config.max_seq_length}


def describe(result: dict) -> str:
  """The table and its totals, for the terminal."""
  lines = ["| m x k x n | form | count | XLA GFLOP/s | torch GFLOP/s | torch faster by |",
           "|---|---|---:|---:|---:|---:|"]
  for r in result["products"]:
    lines.append(f"| {r['m']} x {r['k']} x {r['n']} | {r['form']} | {r['count']} | "
                 f"{r['xla_gflops']:.0f} | {r['torch_gflops']:.0f} | "
                 f"{r['xla_s'] / r['torch_s']:.2f}x |")
  share = result["share_of_step_flops"]
  lines.append(
      f"the step's 2-D products ({result['product_flops'] / 1e9:.0f} GFLOP"
      + (f", {share:.0%} of the step's XLA flops" if share else "")
      + f"): XLA {result['xla_s']:.2f} s, torch {result['torch_s']:.2f} s -> XLA takes "
      f"{result['xla_over_torch']:.2f}x torch's time; medians of {result['rounds']} rounds")
  return "\n".join(lines)
