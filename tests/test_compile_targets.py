"""The compile tier: recipes compiled for a TPU slice and an H100 by their own compilers
(bertjax.tools.compile: XLA:TPU with Mosaic from libtpu, XLA:GPU with Triton from the CUDA
plugin), on this CPU, with what must fail failing. The compilers come with
requirements-test.txt; the suite itself stays on the CPU.

Cost (2 CPU cores, shared): about 3 minutes in all, most of it the module fixtures' compiles
(each recipe once per target, shared by the tests that read it); README states it.
"""

import importlib.util
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from bertjax.core.errors import UserError
from bertjax.models import kernels
from bertjax.runtime import step_memory
from bertjax.tools import compile as compile_tool
from bertjax.tools import hlo_stats, targets
from bertjax.trainer import run_plan, steps, train
from tests.helpers import REPO, load_config, run_module

COMPILERS = {"libtpu": targets.TPU_EXTRA, "jax_plugins.xla_cuda13": targets.GPU_EXTRA}
MISSING = [extra for module, extra in COMPILERS.items() if not targets.installed(module)]
needs_compilers = pytest.mark.skipif(
    bool(MISSING), reason=f"install requirements-test.txt ({'; '.join(MISSING)})")

# The tier's recipes at their runlocal size, each compiled once per target by the fixtures.
RECIPES = ["configs/quickstart.py:runlocal", "configs/modernbert.py:runlocal"]
TPU, GPU = "v5e-4", "h100"  # v5e:2x2, TPU set with splash through Mosaic; one H100, GPU set


def test_the_suite_stays_on_the_cpu_with_the_compilers_installed():
  """conftest.py's JAX_PLATFORMS=cpu holds with libtpu and the CUDA plugin installed: JAX's
  default backend, and every device the tests see, is the CPU."""
  assert os.environ["JAX_PLATFORMS"] == "cpu"
  assert jax.default_backend() == "cpu"
  assert {d.platform for d in jax.devices()} == {"cpu"}
  assert kernels.backend() == "cpu"


@pytest.mark.slow
def test_a_plain_run_prints_no_compiler_warnings(tmp_path):
  """A run's one-line error stays one line with the compilers installed (no libtpu or CUDA
  plugin warnings): what several tests of the suite assert of a run's stderr."""
  r = run_module("launch.py", "--config", "configs/quickstart.py:runlocal", "--workdir",
                 str(tmp_path / "w"), "--config.mesh_shape=(2,1,1)")
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr


@pytest.mark.parametrize("name, devices, chip", [
    ("v2-8", 8, "TPU v2"), ("v3-32", 32, "TPU v3"), ("v3-2048", 2048, "TPU v3"),
    ("v4-32", 16, "TPU v4"), ("v5p-16", 8, "TPU v5"), ("v5e-16", 16, "TPU v5 lite"),
    ("v5litepod-4", 4, "TPU v5 lite"), ("v5e-1", 1, "TPU v5 lite"), ("v6e-8", 8, "TPU v6 lite")])
@needs_compilers
def test_a_slice_compiles_for_the_devices_the_real_slice_shows(name, devices, chip):
  """Per generation, as a VM of that slice shows them: v2 and v3 one device per TensorCore
  (v3-2048: the LAMB paper's 1,024 chips), v4 and v5p one per chip of two cores (megacore),
  v5e and v6e one per chip."""
  target = targets.resolve(name)
  assert len(target.devices) == devices and target.chip == chip and target.platform == "tpu"


@needs_compilers
def test_gpu_targets_are_one_gpu_one_host_or_several():
  assert [len(targets.resolve(n).devices) for n in ("h100", "h200-8", "b200-8x2")] == [1, 8, 16]
  assert targets.resolve("h100").memory_bytes == 80 * 2**30
  assert targets.resolve("h100").chip == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("argv, needle", [
    (["--target=v7x-8"], "unknown target 'v7x-8'; known: cpu-N; TPU slices v2-N"),
    (["--target=h100x"], "unknown target 'h100x'"),
    (["--target=v4-12"], "v4-12: a v4 slice counts TensorCores (two per chip), a power of two"),
    (["--target=cpu-1", "--mesh=2,1,1"], "--mesh=2,1,1 uses 2 devices but cpu-1 has 1; fix: "),
    (["--target=cpu-1", "--mesh=2,1"], "--mesh='2,1' takes three sizes data,fsdp,tensor"),
])
def test_bad_input_is_one_line(argv, needle):
  with pytest.raises(UserError) as e:
    compile_tool.main(["--config", str(REPO / "configs/quickstart.py:runlocal"), *argv])
  assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("target, module, extra", [
    ("v5e-4", "libtpu", "jax[tpu]=="), ("h100", "jax_plugins.xla_cuda13", "jax-cuda13-plugin==")])
def test_a_target_whose_compiler_is_missing_names_what_to_install(monkeypatch, target, module,
                                                                  extra):
  found = importlib.util.find_spec
  monkeypatch.setattr(targets.importlib.util, "find_spec",
                      lambda name, *a: None if name == module else found(name, *a))
  with pytest.raises(UserError, match="which is not installed; fix: install") as e:
    targets.resolve(target)
  assert extra in str(e.value)


@needs_compilers
@pytest.mark.parametrize("target", ["v5e-1", "h100", "cpu-1"])
def test_flops_are_counted_from_each_compilers_hlo(target):
  """A batched attention product and a loop of three matrix products: XLA:TPU writes the first
  as a convolution whose window meets each batch element once (dilated and strided), XLA:GPU as
  Triton GEMMs, XLA:CPU as dots; the count is the same, the loop's body three times."""
  mesh = jax.sharding.Mesh(list(targets.resolve(target).devices)[:1], ("d",))
  spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16,
                                             sharding=jax.sharding.NamedSharding(mesh, P()))

  def step(q, k, w):
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k)  # 2 x 4*2*128*128 x 64
    x = scores.reshape(-1, 128)
    x = jax.lax.fori_loop(0, 3, lambda i, x: jnp.tanh(x @ w), x)  # 3 x 2 x 1024*128 x 128
    return x.sum()
  text = jax.jit(step).lower(spec(4, 2, 128, 64), spec(4, 2, 128, 64),
                             spec(128, 128)).compile().as_text()
  assert hlo_stats.flops(text) == 2 * 4 * 2 * 128 * 128 * 64 + 3 * 2 * 1024 * 128 * 128


@pytest.fixture(scope="module")
def compiled():
  """{(recipe, target): Report}, each compiled once (the tier's cost)."""
  reports = {}
  for spec in RECIPES:
    for name in (TPU, GPU):
      reports[spec, name] = compile_tool.compile_step(load_config(spec), targets.resolve(name))
  return reports


@pytest.mark.slow
@needs_compilers
@pytest.mark.parametrize("spec", RECIPES)
def test_a_recipe_compiles_for_a_tpu_slice_with_splash_through_mosaic(compiled, spec):
  report = compiled[spec, TPU]
  assert report.mesh_shape == (4, 1, 1) and report.fits
  assert report.kernels["custom call: tpu_custom_call"] >= 1  # splash, compiled by Mosaic
  # XLA:TPU's own count (a loop's body once) and ours agree where the step has no loop (the
  # quickstart; ModernBERT's scans its 4 micro-batches).
  if " while(" not in report.compiled.as_text():
    assert 0.8 < report.flops / report.xla_flops < 1.25
  else:
    assert report.flops > 2 * report.xla_flops
  assert "fits" in "\n".join(compile_tool.lines(report))


@pytest.mark.slow
@needs_compilers
@pytest.mark.parametrize("spec", RECIPES)
def test_a_recipe_compiles_for_an_h100_with_the_gpu_set(compiled, spec):
  report = compiled[spec, GPU]
  assert report.fits and report.xla_flops is None and report.flops > 0  # counted from the HLO
  assert any(kind.startswith("fusion: __triton") for kind in report.kernels)
  # The same step's matrix products on either chip, counted from each one's HLO (the TPU's
  # convolutions, the GPU's dots and GEMM fusions): a v5e of four holds a quarter of the batch.
  assert 0.8 < report.flops / (4 * compiled[spec, TPU].flops) < 1.25


@pytest.mark.slow
@needs_compilers
def test_a_step_larger_than_the_chip_does_not_fit_with_its_figures(capsys):
  """The twin: a vocabulary of 2**25 rows (4 GiB of float32 embedding, 12 GiB with Adam's two
  moments, and as much again in its gradient) on one v5e of 16 GiB. XLA:TPU refuses to compile
  it; the line gives its figures and the fix."""
  with pytest.raises(UserError) as e:
    compile_tool.main(["--config", str(REPO / "configs/quickstart.py:runlocal"),
                       "--target=v5e-1", "--config.model.vocab_size=33554432"])
  line = str(e.value)
  assert "\n" not in line and "does not fit v5e-1's memory" in line and "fix: " in line
  assert "G" in line  # XLA's figures: what the program needs against the HBM available


@pytest.mark.slow
def test_a_step_larger_than_a_device_that_compiles_anyway_is_refused_with_its_figures(capsys):
  """The twin where the compiler does not refuse (XLA:GPU, XLA:CPU compile a program larger than
  the device): the verdict comes from the memory analysis. A vocabulary of 2**27 rows: 64 GiB of
  float32 embedding, three times that with Adam's moments, past any host's memory."""
  with pytest.raises(UserError) as e:
    compile_tool.main(["--config", str(REPO / "configs/quickstart.py:runlocal"),
                       "--target=cpu-1", "--config.model.vocab_size=134217728"])
  line = str(e.value)
  assert "\n" not in line and "per device (XLA's compiled estimate) but a cpu-1 device" in line
  assert ": it does not fit by " in line and "GiB; fix: " in line
  out = capsys.readouterr().out
  assert "does not fit by" in out and "arguments" in out  # the report's figures, on stdout


@pytest.mark.slow
def test_cpu_target_compiles_the_trainers_own_step():
  """The one setup: the compile tool's cpu-1 step and the trainer's (train.setup, its concrete
  state) compile to the same HLO (its instructions; the source metadata aside)."""
  config = load_config("configs/quickstart.py:runlocal", **{"data.synthetic": True})
  report = compile_tool.compile_step(load_config("configs/quickstart.py:runlocal"),
                                     targets.resolve("cpu-1"))
  plan = run_plan.plan(config, None, jax.devices()[:1])
  s, state = train.setup(config, plan.objective, plan.model_cfg, plan.mesh, None,
                         plan.grad_accum_steps, rules=plan.rules)
  batch = steps.batch_specs(config, plan.objective, plan.mesh)
  with jax.set_mesh(plan.mesh), nn.logical_axis_rules(plan.rules):
    trainer = s.train_step.lower(state, batch).compile()
  ours, theirs = (hlo_stats.program(c.as_text()) for c in (report.compiled, trainer))
  assert ours == theirs and ours.count("\n") > 1000
  assert report.footprint == step_memory.footprint(trainer) and report.fits
  assert hlo_stats.flops(trainer.as_text()) == report.flops > 0
