"""Every recipe's TPU-set train step lowers for a TPU pod on this CPU (bertjax.tools.tpu_lowering).

`jax.export.export(jax.jit(step), platforms=["tpu"])` over a 16-device abstract mesh (a v4-32's
size; no devices), the Pallas splash kernel lowered to its Mosaic call, not interpreted. What this
proves and what it does not: the tool's docstring.
"""

import jax.numpy as jnp
import pytest

from bertjax.core.errors import UserError
from bertjax.models import splash
from bertjax.tools import tpu_lowering
from tests.helpers import REPO, load_config

# The tensor layout (4 data x 2 fsdp x 2 tensor) holds all three axes. ELECTRA's generator has
# one head at its sizes (a quarter of small's four): it cannot split over a tensor axis, which the
# settings check refuses in one line (asserted below); it lowers on data and fsdp.
RECIPES = [("configs/quickstart.py:runlocal", (4, 2, 2)), ("configs/bert.py:runlocal", (4, 2, 2)),
           ("configs/roberta.py:runlocal", (4, 2, 2)), ("configs/albert.py:runlocal", (4, 2, 2)),
           ("configs/spanbert.py:runlocal", (4, 2, 2)),
           ("configs/modernbert.py:runlocal", (4, 2, 2)),
           ("configs/electra.py:runlocal", (8, 2, 1)),
           ("configs/glue.py:task=rte,runlocal", (4, 2, 2)), ("configs/squad.py:runlocal", (4, 2, 2)),
           ("configs/ner.py:runlocal", (4, 2, 2))]
# Distillation is left out: its step needs a trained teacher's workdir to build.


def export(spec, mesh, **settings):
  return tpu_lowering.export_train_step(load_config(spec, **settings), mesh)


@pytest.mark.slow
@pytest.mark.parametrize("spec, mesh", RECIPES, ids=[r[0].split("/")[1] for r in RECIPES])
def test_every_recipe_lowers_for_tpu_over_16_devices(spec, mesh):
  exported = export(spec, mesh)
  assert exported.platforms == ("tpu",)
  assert exported.nr_devices == 16
  # Splash attention where the recipe trains without attention dropout (all runlocal recipes).
  assert tpu_lowering.custom_calls(exported) == ["tpu_custom_call"]


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [(16, 1, 1), (1, 16, 1)], ids=["data", "fsdp"])
def test_the_quickstart_lowers_on_a_data_and_an_fsdp_layout(mesh):
  """All 16 devices on one batch axis: 16 rows, one per device."""
  exported = export("configs/quickstart.py:runlocal", mesh, batch_size=16)
  assert exported.nr_devices == 16 and tpu_lowering.custom_calls(exported) == ["tpu_custom_call"]


@pytest.mark.slow
def test_electras_one_head_generator_is_refused_on_a_tensor_axis():
  with pytest.raises(UserError, match="generator/.*not divisible by 2, the size of mesh axis tensor"):
    export("configs/electra.py:runlocal", (4, 2, 2))


@pytest.mark.slow
def test_a_block_size_the_tpu_kernel_refuses_fails_here(monkeypatch):
  """The twin: splash with 64-row query blocks. Interpret mode (what the CPU suite otherwise runs)
  computes it; lowered for TPU the kernel refuses it (block_q must fill the 128 lanes), so the
  lowering test catches a block shape that only a TPU would have refused."""
  original = splash.kernel_lib.BlockSizes

  def short_queries(**sizes):
    return original(**{**sizes, "block_q": 64, "block_q_dkv": 64, "block_q_dq": 64})
  monkeypatch.setattr(splash.kernel_lib, "BlockSizes", short_queries)
  q = jnp.ones((1, 128, 2, 64))
  assert splash.splash_attention(q, q, q, interpret=True).shape == q.shape
  with pytest.raises(NotImplementedError, match="block_q must be a multiple of 128"):
    export("configs/quickstart.py:runlocal", (4, 2, 2))


@pytest.mark.slow
def test_the_tool_prints_one_line(capsys):
  tpu_lowering.main(["--config", str(REPO / "configs/quickstart.py:runlocal"), "--mesh", "4,2,2"])
  out = capsys.readouterr().out.strip().splitlines()
  assert len(out) == 1 and "lowers for TPU over a 16-device mesh (4, 2, 2)" in out[0]
  assert "tpu_custom_call" in out[0]
