"""`benchmark --gemm_rate` reads the step's matrix products out of its HLO and adds up their
times on each side (the figures themselves are measurements: no speed thresholds here)."""

import collections
import json
import sys

import jax.numpy as jnp
import pytest

from bertjax.core.errors import UserError
from bertjax.tools import benchmark, gemm_rate
from bertjax.tools.gemm_rate import Product


def test_the_step_products_are_every_dense_forward_and_backward(capsys):
  # bert-tiny: L=2, H=128, I=512; 2 x 32 rows; every layer computes every row.
  result = benchmark.main(["--gemm_rate", "--preset", "bert-tiny", "--batch_size", "2",
                           "--seq_len", "32", "--rounds", "1", "--override",
                           "max_predictions_per_seq=4", "--override",
                           "model.gather_last_layer=False"])
  counts = {(r["m"], r["k"], r["n"], r["form"]): r["count"] for r in result["products"]}
  rows, hidden, inner, layers = 64, 128, 512, 2
  # Each Dense [in, out] is x @ W forward, dy @ W^T for its input's gradient (nt) and x^T @ dy
  # for its weight's (tn). Query, key, value and output: 4 a layer.
  assert counts[(rows, hidden, hidden, "nn")] == 4 * layers
  assert counts[(rows, hidden, hidden, "nt")] == 4 * layers
  assert counts[(hidden, rows, hidden, "tn")] == 4 * layers
  # The feed-forward's two products a layer, each with its two gradients.
  assert counts[(rows, hidden, inner, "nn")] == layers
  assert counts[(rows, inner, hidden, "nt")] == layers
  assert counts[(hidden, rows, inner, "tn")] == layers
  assert counts[(rows, inner, hidden, "nn")] == layers
  assert counts[(rows, hidden, inner, "nt")] == layers
  assert counts[(inner, rows, hidden, "tn")] == layers
  # The totals are the table's sums; the encoder's products are most of the step's flops.
  assert result["xla_s"] == pytest.approx(sum(r["count"] * r["xla_s"] for r in result["products"]))
  assert result["torch_s"] == pytest.approx(
      sum(r["count"] * r["torch_s"] for r in result["products"]))
  assert result["xla_over_torch"] == pytest.approx(result["xla_s"] / result["torch_s"])
  assert all(r["xla_s"] > 0 and r["torch_s"] > 0 for r in result["products"])
  assert 0.5 < result["share_of_step_flops"] <= 1.0
  out = capsys.readouterr().out
  assert "| 64 x 128 x 512 | nn | 2 |" in out and "XLA takes" in out
  assert json.loads(out.strip().splitlines()[-1])["xla_over_torch"] == result["xla_over_torch"]


HLO = """
%fused_computation.1 (param_0.1: f32[8,4], param_1.1: f32[6,4]) -> f32[8,6] {
  %param_0.1 = f32[8,4]{1,0} parameter(0)
  %param_1.1 = f32[6,4]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,6]{1,0} dot(%param_0.1, %param_1.1), lhs_contracting_dims={1}, rhs_contracting_dims={1}, metadata={op_name="x"}
}
ENTRY %main (a: f32[4,8], b: f32[6,4], q: f32[2,3,5,7], k: f32[2,3,9,7]) -> f32[8,4] {
  %a = f32[4,8]{1,0} parameter(0)
  %b = f32[6,4]{1,0} parameter(1)
  %q = f32[2,3,5,7]{3,2,1,0} parameter(2)
  %k = f32[2,3,9,7]{3,2,1,0} parameter(3)
  %dot.2 = f32[8,6]{1,0} dot(%a, %b), lhs_contracting_dims={0}, rhs_contracting_dims={1}
  %dot.3 = f32[2,3,5,9]{3,2,1,0} dot(%q, %k), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={3}
  %dot.4 = f32[8,6]{1,0} dot(%a, %b), lhs_contracting_dims={0}, rhs_contracting_dims={1}
}
"""


def test_products_read_forms_and_skip_batched_products():
  found = gemm_rate.products(HLO)
  # [8, 4] @ [6, 4]^T: m=8, k=4, n=6; [4, 8]^T @ [6, 4]^T twice; the per-head product skipped.
  assert found == collections.Counter({Product(8, 4, 6, "nt", "f32"): 1,
                                       Product(8, 4, 6, "tt", "f32"): 2})
  assert Product(8, 4, 6, "tt", "f32").operand_shapes() == ((4, 8), (6, 4))
  assert Product(8, 4, 6, "nn", "f32").flops == 2 * 8 * 4 * 6


def test_summary_weights_each_product_by_its_count():
  big, small = Product(100, 10, 10, "nn", "f32"), Product(10, 10, 10, "nt", "f32")
  result = gemm_rate.summarize(collections.Counter({big: 3, small: 1}),
                               xla_s={big: 2.0, small: 1.0}, torch_s={big: 1.0, small: 1.0},
                               step_flops=2 * (3 * big.flops + small.flops))
  assert result["xla_s"] == 7.0 and result["torch_s"] == 4.0
  assert result["xla_over_torch"] == 1.75
  assert result["share_of_step_flops"] == 0.5
  assert [r["count"] for r in result["products"]] == [3, 1]  # most flops first
  assert result["products"][0]["xla_gflops"] == pytest.approx(big.flops / 2.0 / 1e9)


def test_without_torch_the_measurement_is_one_line(monkeypatch):
  monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
  with pytest.raises(UserError, match=r"torch too, which is not installed; pip install -r "
                                      r"requirements-test.txt"):
    gemm_rate._timers(Product(8, 4, 6, "nn", "f32"), repeats=1)  # pylint: disable=protected-access


def test_half_precision_products_are_timed_in_their_dtype():
  import torch  # pylint: disable=import-outside-toplevel
  product = Product(8, 4, 6, "nt", "bf16")
  (a, b), (ta, tb) = gemm_rate.operands(product, torch)
  assert a.dtype == jnp.bfloat16 and b.dtype == jnp.bfloat16
  assert ta.dtype == torch.bfloat16 and tb.dtype == torch.bfloat16
  # nt: [8, 4] @ [6, 4]^T on both sides.
  assert (a.shape, b.shape) == ((8, 4), (6, 4)) and tuple((ta @ tb).shape) == (8, 6)
  xla, torch_ = gemm_rate._timers(product, repeats=1)  # pylint: disable=protected-access
  assert xla() > 0 and torch_() > 0
  with pytest.raises(UserError, match="s8 matrices, which it cannot time"):
    gemm_rate.operands(Product(8, 4, 6, "nn", "s8"), torch)


def test_on_an_accelerator_it_says_to_run_on_the_cpu(monkeypatch):
  monkeypatch.setattr(gemm_rate.jax, "default_backend", lambda: "gpu")
  with pytest.raises(UserError, match=r"this process's JAX runs on gpu; run it with "
                                      r"JAX_PLATFORMS=cpu"):
    gemm_rate.measure(None, rounds=1, step_hlo=benchmark.step_hlo)
