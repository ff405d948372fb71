"""What a compiled step holds, read from its optimized HLO (`compiled.as_text()`): its kernels by
kind and the FLOPs of its matrix products.

Kernels are counted as they stand in the module (a loop's body once): fusions by kind (XLA's
loop, input, output fusions; custom fusions by their backend: Triton GEMM, cuBLAS, ...), custom
calls by target (`tpu_custom_call`: a Pallas kernel compiled by Mosaic; `__gpu$xla.gpu.triton`: a
Pallas Triton kernel; `__cublas$gemm`: a cuBLAS GEMM; cuDNN's), and collectives.

FLOPs: 2 x the result's elements x the contracted size, for every dot, GEMM call and
convolution (XLA:TPU's form of a dot), through the call graph, a `while` body counted as often as XLA's known trip count says (a
scan over layers or micro-batches). XLA's own `cost_analysis()` counts a loop's body once and
gives nothing on the GPU path; this count is the one that holds for both.
"""

from __future__ import annotations

import collections
import math
import re

import numpy as np

_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
# name = type op(operands), ...: the type an array (f32[8,16]{1,0}) or a tuple of them.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\(.*?\)|\S+)\s+([\w\-$]+)\(")
_SHAPE = re.compile(r"\w+\[([\d,]*)\]")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
               "ragged-all-to-all")


def computations(text: str) -> tuple[dict[str, list[str]], str]:
  """{name: its instruction lines} of an HLO module's text, and the entry computation's name."""
  comps, entry, current = {}, "", None
  for line in text.splitlines():
    if current is None:
      m = _COMPUTATION.match(line)
      if m and "->" in line:
        current = m.group(2)
        comps[current] = []
        entry = current if m.group(1) else entry
    elif line.strip() == "}":
      current = None
    else:
      comps[current].append(line)
  return comps, entry


def program(text: str) -> str:
  """The module's computations without their source metadata (file and op names, stack frames,
  whose numbering follows the order things were traced): two modules of one program compare
  equal."""
  comps, entry = computations(text)
  strip = lambda line: re.sub(r",? metadata=\{[^}]*\}", "", line)
  return "\n".join(f"{name}{' (entry)' if name == entry else ''}\n" +
                   "\n".join(strip(l) for l in lines) for name, lines in comps.items())


def _dims(text: str) -> list[int]:
  return [int(d) for d in text.split(",") if d]


def _ints(line: str, key: str) -> list[int]:
  m = re.search(key + r"=\{([\d,]*)\}", line)
  return _dims(m.group(1)) if m else []


def _operands(line: str) -> list[str]:
  """The operand names of an instruction line (after its type, whose tiling has parentheses)."""
  m = _INSTRUCTION.match(line)
  rest = line[m.end():] if m else ""
  return [o.strip().lstrip("%") for o in rest[:rest.find(")")].split(",") if o.strip()]


def _gemm_flops(line: str, shapes: dict[str, list[int]], result: list[int]) -> int:
  """A dot's, or a cuBLAS/cuBLASLt GEMM call's (its dimension numbers in its backend config)."""
  names = _operands(line)
  lhs = shapes.get(names[0]) if names else None
  contracting = _ints(line, "lhs_contracting_dims")
  if not contracting:
    m = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', line)
    contracting = [int(d.strip('"')) for d in m.group(1).split(",") if d] if m else []
  if lhs is None or not contracting:
    return 0
  return 2 * math.prod(result) * math.prod(lhs[d] for d in contracting if d < len(lhs))


def _window(line: str, spatial: int) -> dict[str, list[tuple[int, ...]]]:
  """A convolution's window attributes per spatial dimension (XLA's defaults where absent)."""
  found = re.search(r"window=\{([^}]*)\}", line)
  fields = dict(f.split("=", 1) for f in found.group(1).split()) if found else {}
  per_dim = lambda key, default: ([tuple(int(v) for v in d.split("_")) for d in
                                   fields[key].split("x")] if key in fields else [default] * spatial)
  return {"stride": per_dim("stride", (1,)), "pad": per_dim("pad", (0, 0)),
          "lhs_dilate": per_dim("lhs_dilate", (1,)), "rhs_dilate": per_dim("rhs_dilate", (1,))}


def _taps(out: int, kernel: int, size: int, stride: int, pad_low: int, lhs_dilate: int,
          rhs_dilate: int) -> int:
  """(output position, kernel tap) pairs of one spatial dimension that meet a real input element
  (not padding, not a hole of the input's dilation)."""
  o, k = np.meshgrid(np.arange(out), np.arange(kernel), indexing="ij")
  p = o * stride + k * rhs_dilate - pad_low
  return int(np.sum((p >= 0) & (p <= (size - 1) * lhs_dilate) & (p % lhs_dilate == 0)))


def _convolution_flops(line: str, shapes: dict[str, list[int]], result: list[int]) -> int:
  """XLA:TPU writes a dot as a convolution (dim_labels=bf_io->bf), a batched one with the batch
  dimensions as spatial ones that a dilated, strided window meets once per output
  (window={size=16x12 stride=15x11 lhs_dilate=16x12}): 2 x the output's batch and features x
  the kernel's input features x, per spatial dimension, the (output, tap) pairs that meet a real
  input element."""
  labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", line)
  names = _operands(line)
  lhs, rhs = (shapes.get(names[0]), shapes.get(names[1])) if len(names) > 1 else (None, None)
  if not labels or lhs is None or rhs is None or (len(lhs), len(rhs), len(result)) != tuple(
      map(len, labels.groups())):
    return 0
  size = {side: dict(zip(label, dims)) for side, label, dims in
          zip("kro", labels.groups(), (lhs, rhs, result))}
  spatial = sorted(l for l in labels.group(2) if l.isdigit())
  window = _window(line, len(spatial))
  work = size["r"]["i"] * size["o"]["b"] * size["o"]["f"]
  for n, d in enumerate(spatial):
    work *= _taps(size["o"][d], size["r"][d], size["k"][d], window["stride"][n][0],
                  window["pad"][n][0], window["lhs_dilate"][n][0], window["rhs_dilate"][n][0])
  return 2 * work


def _trips(line: str, comps: dict[str, list[str]]) -> int:
  """A while loop's trip count: XLA's known_trip_count (GPU, CPU), else its condition's `i < N`
  on one integer constant (XLA:TPU; jax's loops count from 0 by 1), else 1."""
  known = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
  if known:
    return int(known.group(1))
  cond = re.search(r"condition=%?([\w.\-]+)", line)
  body = comps.get(cond.group(1), []) if cond else []
  bounds = [int(c) for l in body for c in re.findall(r"\bconstant\((\d+)\)", l)]
  less = any("compare(" in l and "direction=LT" in l for l in body)
  return bounds[0] if less and len(bounds) == 1 else 1


def flops(text: str) -> int:
  """FLOPs of the matrix products of one execution of the module (module docstring)."""
  comps, entry = computations(text)
  memo: dict[str, int] = {}

  def of(name: str) -> int:
    if name in memo or name not in comps:
      return memo.get(name, 0)
    memo[name] = 0  # a cycle cannot happen in HLO; this only guards the recursion
    shapes, total = {}, 0
    for line in comps[name]:
      m = _INSTRUCTION.match(line)
      if m:
        first = _SHAPE.search(m.group(2))  # a tuple's first element: a GEMM call's result
        shapes[m.group(1)] = shape = _dims(first.group(1)) if first else []
        op = m.group(3)
        if op == "dot" or (op == "custom-call" and "gemm" in line and "lhs_contracting" in line):
          total += _gemm_flops(line, shapes, shape)
        elif op == "convolution":
          total += _convolution_flops(line, shapes, shape)
      called = _CALLS.findall(line)
      if " while(" in line:
        total += _trips(line, comps) * sum(of(c) for c in called)
      else:
        total += sum(of(c) for c in called)
      branches = _BRANCHES.search(line)
      if branches:
        total += max((of(b.strip().lstrip("%")) for b in branches.group(1).split(",")), default=0)
    memo[name] = total
    return total

  return of(entry)


def _fusion_kind(line: str) -> str:
  kind = re.search(r"kind=(k\w+)", line)
  label = {"kLoop": "loop", "kInput": "input (reduction)", "kOutput": "output",
           "kCustom": "custom"}.get(kind.group(1) if kind else "", "other")
  if label == "custom":
    m = re.search(r'"kind":"([^"]+)"', line)
    label = m.group(1) if m else label
  return f"fusion: {label}"


def kernels(text: str) -> dict[str, int]:
  """{kind: count} of the module's fusions, custom calls (by target) and collectives, as they
  stand in the module (a loop's body once)."""
  counts: collections.Counter = collections.Counter()
  for line in text.splitlines():
    m = _INSTRUCTION.match(line)
    if not m:
      continue
    op = m.group(3)
    if op == "fusion":
      counts[_fusion_kind(line)] += 1
    elif op == "custom-call":
      target = re.search(r'custom_call_target="([^"]+)"', line)
      counts[f"custom call: {target.group(1) if target else '?'}"] += 1
    elif op.removesuffix("-start") in COLLECTIVES:
      counts[f"collective: {op.removesuffix('-start')}"] += 1
  return dict(sorted(counts.items()))
