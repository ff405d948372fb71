"""Times the full pretraining train step and reports tokens/s, MFU and memory; optionally side by
side with transformers' PyTorch BertForPreTraining at the same shapes (ModernBertForMaskedLM for
the ModernBERT presets, which train MLM alone).

  python -m bertjax.tools.benchmark --preset bert-mini --batch_size 16 --seq_len 128 \
      --objective mlm_nsp --steps 20 --compare hf-torch
  python -m bertjax.tools.benchmark --config configs/quickstart.py --steps 10
  python -m bertjax.tools.benchmark --preset modernbert-base --batch_size 2 --seq_len 512 \
      --override max_predictions_per_seq=77 --steps 3 --compare hf-torch --rounds 3
  python -m bertjax.tools.benchmark --ablate h100-bert-base --output ablate.md   # tools/ablate.py
  python -m bertjax.tools.benchmark --gemm_rate --preset bert-base --batch_size 8 --rounds 3
  python -m bertjax.tools.benchmark --preset modernbert-tiny --batch_size 16 --seq_len 512 \
      --lengths wikitext2 [--pack]

The step timed is the real one (`bertjax.trainer.train.make_train_step`: forward, backward,
optimizer) on synthetic batches, after compilation; the step time is the median of `--steps` runs.
The last line printed is one JSON object holding every figure.

Rows: by default each synthetic row is 50-100% full (bertjax.inputs.SyntheticBatches).
`--lengths` gives rows the lengths of real, ragged data instead (bertjax/data/ragged.py: the
WikiText-2 paragraphs or articles, or a parametric `ragged:MEAN,MIN`), built by the pretraining
pipeline from synthetic documents of those lengths: padded, one instance per row, or with `--pack`
(or a config whose data.pack is set) packed first-fit into rows with segment ids, as a run packs.
`tokens_per_s` counts every slot of batch x seq, as before; `real_tokens_per_s` counts the
attention mask's ones (the tokens a step trains on), and `fill` is their share of the slots, so a
padded and a packed row compare on the tokens they train. `--rounds N` (with `--compare`)
alternates the two sides N times in fresh processes and reports the median of the per-round ratios.
The reference runs before this process touches a device: JAX preallocates most of an
accelerator's memory when it starts, and the reference would then run out of it.

FLOPs: model FLOPs per token = 6 * N_matmul + 12 * L * S * H (attention scores and values),
where N_matmul counts the weights a token passes through as matrix multiplies (not embedding
lookups), and the MLM decoder and transform count only at the masked positions (P of S tokens),
which is all our head computes. Likewise the last layer's queries, attention output and
feed-forward count only at the rows the heads read (P + 1 with [CLS]; `model.gather_last_layer`).
ModernBERT: its GeGLU feed-forward passes through 3 * H * I weights (two H x I input halves, one
I x H output), its local layers' queries see `local_attention` + 1 keys (fewer near the ends,
not counted) instead of S, and its last layer computes every row.
Hardware FLOPs add the forward pass recomputed under remat.
MFU = tokens/s * model FLOPs per token / peak FLOP/s of the device (a table of bf16 peaks for
accelerators; on a CPU, a large float32 matmul's rate measured in the same run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import convert, inputs
from bertjax.config import config_checks, config_lib
from bertjax.core import paths
from bertjax.core.errors import (ArgumentParser, Preempted, UserError, doc_summary, fail,
                                 run_cli)
from bertjax.data import ragged
from bertjax.models import encoder, kernels
from bertjax.registry import get_objective, objective_class
from bertjax.runtime import preemption, profiling, sharding, xla_defaults
from bertjax.runtime.host_memory import host_peak_rss_bytes
from bertjax.tasks.base import TaskObjective
from bertjax.tools import ablate, checkpoint_cost, gemm_rate
from bertjax.trainer import train

REPO = pathlib.Path(__file__).resolve().parent.parent.parent

# bf16 dense peak FLOP/s per chip.
PEAK_FLOPS = {
    "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12,
    "TPU v5": 459e12, "TPU v6 lite": 918e12, "A100": 312e12, "H100": 989e12, "H200": 989e12,
}


def model_flops_per_token(cfg, seq_len: int, num_predictions: int, pair_head: bool = True,
                          last_layer_rows: int | None = None) -> dict:
  """The FLOP count behind MFU, itemized (see the module docstring).

  `last_layer_rows`: rows per sequence at which the last layer computes its queries, attention
  output and feed-forward (model.gather_last_layer: the masked positions and [CLS]); None: all.
  Keys and values are counted at every row either way.
  """
  h, e, v, i, layers = (cfg.hidden_size, cfg.embed_size, cfg.vocab_size, cfg.intermediate_size,
                        cfg.num_hidden_layers)
  modern = cfg.architecture == "modernbert"
  mlp = (3 if modern else 2) * h * i                     # GeGLU: two input halves
  per_layer = 4 * h * h + mlp                            # q, k, v, output; MLP in and out
  rows = seq_len if last_layer_rows is None else min(last_layer_rows, seq_len)
  last = 2 * h * h + (2 * h * h + mlp) * rows / seq_len
  encoder = (layers - 1) * per_layer + last + (e * h if e != h else 0)  # + embedding projection
  # Keys each query sees, per layer (ModernBERT's local layers: the window).
  keys = [seq_len if not modern or cfg.is_global_layer(k) else min(seq_len, cfg.local_attention + 1)
          for k in range(layers)]
  attention = 12 * h * (sum(keys[:-1]) + keys[-1] * rows / seq_len)
  frac = num_predictions / seq_len                       # masked positions per token
  mlm = (e * h + e * v) * frac                           # transform + tied decoder
  pair = (h * h + 2 * h) / seq_len if pair_head else 0.0  # pooler + NSP, once per sequence
  items = {"encoder": 6 * encoder, "attention": attention, "mlm_head": 6 * mlm, "pair_head": 6 * pair}
  items["total"] = sum(items.values())
  return items


def recomputed_flops(cfg, flops: dict) -> float:
  """FLOPs per token the backward pass recomputes under remat: the layer's forward pass (a third
  of forward+backward) for remat_policy "full", the attention products only for "dots" (the
  weight products' outputs are kept)."""
  if not cfg.remat:
    return 0.0
  if cfg.remat_policy == "dots":
    return flops["attention"] / 3
  return flops["encoder"] / 3 + flops["attention"] / 3


def last_layer_rows(cfg, config) -> int | None:
  """Rows the last layer computes per sequence under `config` (None: every row)."""
  if cfg.architecture == "modernbert":  # no gathered last layer
    return None
  per_prediction = objective_class(config.objective).output_rows_per_prediction
  if per_prediction is None:
    return None
  outputs = per_prediction * config.max_predictions_per_seq
  rows = encoder.last_layer_rows(cfg, outputs, config.max_seq_length,
                                 kernels.for_model(cfg).row_multiple)
  # Model FLOPs count the rows the heads read; rows padded for the fused kernel are overhead.
  return None if rows is None else min(rows, outputs + 1)


def measure_cpu_peak(size: int = 2048, repeats: int = 5) -> float:
  """FLOP/s of a large float32 matmul on this machine (the CPU's practical peak)."""
  a = jnp.ones((size, size), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    f(a).block_until_ready()
    times.append(time.perf_counter() - t)
  return 2 * size ** 3 / min(times)


def device_peak(device) -> tuple[float | None, str]:
  kind = getattr(device, "device_kind", "") or ""
  for name, peak in PEAK_FLOPS.items():
    if name.lower() in kind.lower():
      return peak, f"{name} bf16 peak"
  if device.platform == "cpu":
    return None, "measured float32 matmul rate"
  return None, f"unknown device {kind!r}"


def peak_memory_bytes(device) -> int:
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  if stats and "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"])
  return host_peak_rss_bytes()


def build_config(args):
  """The config the step is timed with; a refused setting is one line naming this command's
  own flag (--override KEY=VALUE), as the trainer's checks name launch.py's --config.KEY=VALUE."""
  try:
    return _build_config(args)
  except UserError as e:
    raise type(e)(str(e).replace("--config.", "--override ")) from None


def _build_config(args):
  if args.config:
    config = config_lib.load_config_file(args.config)
  else:
    common = config_lib.load_module(REPO / "configs" / "common.py")
    config = common.base_config()
    with config.unlocked():
      config.model = common.model_config(args.preset)
    config.lock()
  modern = config.model.architecture == "modernbert"
  overrides = ["data.synthetic=True", "optimizer.warmup_steps=0", "total_steps=1000000"]
  if modern and not args.objective and not args.config:
    overrides.append("objective='mlm'")  # ModernBERT has no NSP head
  if args.batch_size is not None:
    overrides.append(f"batch_size={args.batch_size}")
  if args.seq_len is not None:
    overrides += [f"max_seq_length={args.seq_len}"]
  if args.objective:
    overrides.append(f"objective='{args.objective}'")
  if args.pack is not None:
    overrides.append(f"data.pack={args.pack}")
  if args.dtype:
    overrides.append(f"model.dtype='{args.dtype}'")
  if args.remat:
    overrides += ["model.remat=True", f"model.remat_policy='{args.remat}'"]
  if args.dropout is not None:
    names = (("attention_dropout", "embedding_dropout", "mlp_dropout") if modern else
             ("hidden_dropout_prob", "attention_probs_dropout_prob"))
    overrides += [f"model.{name}={args.dropout}" for name in names]
  config_lib.apply_overrides(config, overrides + list(args.override or []))
  if issubclass(objective_class(config.objective), TaskObjective):  # its batches: not synthetic
    fail(f"objective {config.objective!r} is a fine-tuning task; the benchmark times "
         "pretraining objectives on synthetic batches: pass a pretraining config or --objective "
         "(e.g. --config configs/bert.py:runlocal, or --objective mlm)")
  if config.max_seq_length > config.model.max_position_embeddings:
    config_lib.apply_overrides(config, [f"model.max_position_embeddings={config.max_seq_length}"])
  config_checks.check_settings(config)
  return config


class CacheEvents:
  """Counts JAX's persistent-compilation-cache hits and misses while the block runs (JAX's
  monitoring events): whether the train step was loaded from the cache or compiled."""

  def __init__(self):
    self.counts = {"hits": 0, "misses": 0}
    self._on = False

  def _listen(self, event: str, **kwargs) -> None:
    del kwargs
    if self._on and event == "/jax/compilation_cache/cache_hits":
      self.counts["hits"] += 1
    elif self._on and event == "/jax/compilation_cache/cache_misses":
      self.counts["misses"] += 1

  def __enter__(self) -> "CacheEvents":
    self._on = True
    jax.monitoring.register_event_listener(self._listen)
    return self

  def __exit__(self, *exc) -> None:
    self._on = False  # JAX has no public way to remove a listener; this one goes quiet


def real_tokens(batch) -> int:
  """The tokens a batch trains on: its attention mask's ones (padding excluded)."""
  return int(batch["attention_mask"].sum())


def step_setup(config):
  """The trainer's own setup: the same model, optimizer, shardings and jitted step a run trains,
  after the trainer's checks of the settings, the mesh and the model (each a one-line error).
  Returns (objective, model config, mesh, run, train state)."""
  objective = get_objective(config)
  cfg = objective.model_config(config)
  mesh = sharding.make_mesh(config.mesh_shape)
  config_checks.check_ranges(config)
  config_checks.check_run(config, objective, cfg, mesh)
  run, state = train.setup(config, objective, cfg, mesh, rules=sharding.rules_from_config(config))
  return objective, cfg, mesh, run, state


def compiled_flops(compiled) -> float:
  """XLA's count of a compiled step's flops (0 where the backend gives none)."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get("flops", 0.0)) if cost else 0.0


def step_hlo(config) -> tuple[str, float]:
  """The optimized HLO of the step `bench_jax` times (on a full synthetic batch) and its flops."""
  _, cfg, mesh, run, state = step_setup(config)
  batch = next(inputs.SyntheticBatches(config, cfg.vocab_size, config.seed, config.batch_size))
  with jax.set_mesh(mesh), nn.logical_axis_rules(run.rules):
    compiled = run.train_step.lower(state, sharding.shard_batch(batch, mesh)).compile()
  return compiled.as_text(), compiled_flops(compiled)


def bench_jax(config, steps: int, profile_dir: str | None = None,
              lengths: ragged.Lengths | None = None) -> dict:
  """Times the train step of `config` on synthetic batches: full ones (50-100% of each row), or
  with `lengths` ragged rows from the pipeline (padded, or packed when config.data.pack)."""

  objective, cfg, mesh, run, state = step_setup(config)
  n_params = run.num_params
  data = objective.build_inputs(config, None) if not config.data.synthetic else None
  if lengths is not None:
    batches = ragged.ragged_batches(config, objective, lengths, cfg.vocab_size, config.seed,
                                    config.batch_size)
  else:
    batches = (data.train if data else
               inputs.SyntheticBatches(config, cfg.vocab_size, config.seed, config.batch_size))
  host_batches = [next(batches) for _ in range(max(1, min(steps, 4)))]
  batch_real = [real_tokens(b) for b in host_batches]
  with jax.set_mesh(mesh), nn.logical_axis_rules(run.rules):
    batch0 = sharding.shard_batch(host_batches[0], mesh)
    t = time.perf_counter()
    with CacheEvents() as step_cache:
      compiled = run.train_step.lower(state, batch0).compile()
    compile_s = time.perf_counter() - t
    xla_flops = compiled_flops(compiled)
    # The compiled step's own buffers, as XLA planned them: exact and repeatable, where the
    # process's peak memory also holds the runtime and varies by tens of MB between runs.
    memory = compiled.memory_analysis()
    xla_temp = int(memory.temp_size_in_bytes) if memory is not None else None
    tokens = config.batch_size * config.max_seq_length
    device = jax.devices()[0]
    plan = {  # what the compiled step is, before anything runs
        "framework": "bertjax", "device": getattr(device, "device_kind", device.platform),
        "num_devices": jax.device_count(), "objective": config.objective,
        "batch_size": config.batch_size, "seq_len": config.max_seq_length,
        "num_predictions": config.max_predictions_per_seq, "dtype": cfg.dtype,
        "remat": cfg.remat and cfg.remat_policy, "dropout": kernels.dropout_for_model(cfg),
        "num_params": int(n_params),
        "compile_time_s": compile_s, "step_cache": step_cache.counts, "xla_temp_bytes": xla_temp,
        "xla_argument_bytes": int(memory.argument_size_in_bytes) if memory is not None else None,
        "xla_flops_per_token": xla_flops / tokens if xla_flops else None,
        "jax_version": jax.__version__,
        # The rows: their length distribution, packing, and the real tokens of each batch.
        "lengths": lengths.name if lengths is not None else "full",
        "packed": "segment_ids" in host_batches[0], "slots_per_step": tokens,
        "batch_real_tokens": batch_real}
    if steps == 0:  # the compiled step's plan only: nothing runs
      return plan
    device_batches = [sharding.shard_batch(b, mesh) for b in host_batches]
    with sigterm_between_steps() as check:
      state, m = compiled(state, device_batches[0])  # warm-up
      jax.block_until_ready(m)
      times = []
      for k in range(steps):
        check()
        t = time.perf_counter()
        state, m = compiled(state, device_batches[k % len(device_batches)])
        jax.block_until_ready((state.step, m))
        times.append(time.perf_counter() - t)
      profile = None
      if profile_dir:
        check()
        profile = profile_steps(compiled, state, device_batches, profile_dir)
        state = profile.pop("state")
  step_s = statistics.median(times)
  flops = model_flops_per_token(cfg, config.max_seq_length, config.max_predictions_per_seq,
                                pair_head=getattr(objective, "pair_head", False),
                                last_layer_rows=last_layer_rows(cfg, config))
  hw_per_token = flops["total"] + recomputed_flops(cfg, flops)
  peak, peak_source = device_peak(device)
  if peak is None and device.platform == "cpu":
    peak = measure_cpu_peak()
  peak_total = peak * jax.device_count() if peak else None
  tps = tokens / step_s
  # The timed steps cycle through the host batches: their mean real tokens per step.
  real_per_step = statistics.mean(batch_real[k % len(batch_real)] for k in range(steps))
  return {
      **plan, "tokens_per_s": tps, "step_time_s": step_s, "step_time_min_s": min(times),
      "real_tokens_per_step": real_per_step, "real_tokens_per_s": real_per_step / step_s,
      "fill": real_per_step / tokens,
      "peak_memory_bytes": peak_memory_bytes(device),
      "model_flops_per_token": flops["total"], "flops_breakdown": flops,
      "hardware_flops_per_token": hw_per_token,
      "peak_flops": peak_total, "peak_source": peak_source,
      "mfu": tps * flops["total"] / peak_total if peak_total else None,
      "hfu": tps * hw_per_token / peak_total if peak_total else None,
      **({"profile": profile} if profile else {}),
  }


def profile_steps(compiled, state, device_batches, profile_dir: str, steps: int = 3) -> dict:
  """Traces `steps` more steps and writes the per-operation table to profile_dir/ops.{md,json}."""
  out = pathlib.Path(profile_dir)
  out.mkdir(parents=True, exist_ok=True)
  with jax.profiler.trace(str(out), create_perfetto_trace=True):
    for k in range(steps):
      state, m = compiled(state, device_batches[k % len(device_batches)])
      jax.block_until_ready((state.step, m))
  table = profiling.op_table(out, steps)
  paths.replace_text(out / "ops.json", json.dumps(table, indent=1))
  paths.replace_text(out / "ops.md", profiling.format_table(table))
  print(profiling.format_table(table))
  return {"table": str(out / "ops.md"), "step_device_ms": table["step_device_ms"],
          "kernels_per_step": table["kernels_per_step"], "top": table["ops"][:5], "state": state}


def _torch_subprocess(config, steps: int, compile_model: bool = False) -> dict:
  """Runs the PyTorch reference in its own process, so its peak memory is its own."""
  spec = {"model": config.model.to_dict(), "batch_size": config.batch_size,
          "seq_len": config.max_seq_length, "num_predictions": config.max_predictions_per_seq,
          "steps": steps, "learning_rate": config.learning_rate, "compile": compile_model}
  if config.model.architecture == "modernbert":  # its ModernBertConfig, field for field
    spec["hf_config"] = convert.model_config_to_hf_config(
        get_objective(config).model_config(config))
  r = subprocess.run([sys.executable, "-m", "bertjax.tools.torch_benchmark", json.dumps(spec)],
                     capture_output=True, text=True, cwd=REPO, timeout=3600)
  if r.returncode != 0:
    last = (r.stderr.strip().splitlines() or ["no output"])[-1]
    fail(f"the PyTorch reference failed ({last}); install requirements-dev.txt for --compare")
  return json.loads(r.stdout.strip().splitlines()[-1])


def _without(argv: list[str], flags: tuple[str, ...]) -> list[str]:
  """`argv` less the given flags and their values (as `--flag value` or `--flag=value`)."""
  out, skip = [], False
  for a in argv:
    if skip:
      skip = False
    elif a in flags:
      skip = True
    elif not a.startswith(tuple(f + "=" for f in flags)):
      out.append(a)
  return out


def _alternate(config, args, argv: list[str]) -> dict:
  """The reference, then bertjax, `args.rounds` times, each in a fresh process so that each peak
  memory is its own. The reference's speed drifts by tens of percent over a session on a shared
  machine; ratios from adjacent runs, and their median, are the comparable figures."""
  ours_argv = _without(argv, ("--rounds", "--compare", "--profile"))
  rounds = []
  for r in range(args.rounds):
    ref = _torch_subprocess(config, args.steps, args.compare == "hf-torch-compile")
    p = subprocess.run([sys.executable, "-m", "bertjax.tools.benchmark", *ours_argv],
                       capture_output=True, text=True, timeout=3600,
                       cwd=REPO)
    if p.returncode != 0:
      fail(f"the bertjax run of round {r + 1} failed: "
           f"{(p.stderr.strip().splitlines() or ['no output'])[-1]}")
    ours = json.loads(p.stdout.strip().splitlines()[-1])
    rounds.append({"tokens_per_s": ours["tokens_per_s"], "reference_tokens_per_s": ref["tokens_per_s"],
                   "speedup": ours["tokens_per_s"] / ref["tokens_per_s"],
                   "peak_memory_bytes": ours["peak_memory_bytes"],
                   "reference_peak_memory_bytes": ref["peak_memory_bytes"],
                   "memory_ratio": ours["peak_memory_bytes"] / ref["peak_memory_bytes"]})
    print(f"round {r + 1}: bertjax {ours['tokens_per_s']:.0f} tokens/s, {ref['framework']} "
          f"{ref['tokens_per_s']:.0f} -> {rounds[-1]['speedup']:.2f}x, memory "
          f"{rounds[-1]['memory_ratio']:.2f}x")
  median = lambda key: statistics.median(x[key] for x in rounds)
  result = {**ours, "tokens_per_s": median("tokens_per_s"), "rounds": rounds,
            "reference": {**ref, "tokens_per_s": median("reference_tokens_per_s")},
            "speedup_vs_reference": median("speedup"),
            "speedup_range": [min(x["speedup"] for x in rounds), max(x["speedup"] for x in rounds)],
            "memory_ratio_vs_reference": median("memory_ratio")}
  print(f"median of {len(rounds)} rounds: speedup {result['speedup_vs_reference']:.2f}x "
        f"({result['speedup_range'][0]:.2f}-{result['speedup_range'][1]:.2f}), memory "
        f"{result['memory_ratio_vs_reference']:.2f}x")
  return result


_PREEMPTED = ("SIGTERM during the benchmark (it saves nothing); run the same command again to "
              "measure")


def _preempted(signum, frame):
  if preemption.inside_jax(frame):  # an XLA compilation or a wait: raised there, it crashed
    preemption.again_soon(signum)
    return
  raise Preempted(_PREEMPTED)


@contextlib.contextmanager
def sigterm_between_steps():
  """Within it a SIGTERM is noted, and `Preempted` raised by the yielded check, called between
  steps, as the trainer does; the benchmark's own handler (`_preempted`, raising at once) is
  back after. Raised at once, a SIGTERM during the timed steps was seen leaving the process
  waiting in JAX's `block_until_ready` for good (9e59c5e, once in four SIGTERMs here)."""
  came = []
  try:
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: came.append(signum))
  except ValueError:  # not the main thread: its caller handles signals
    previous = None

  def check():
    if came:
      raise Preempted(_PREEMPTED)

  try:
    yield check
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
  check()


def parse_args(argv):
  parser = ArgumentParser(description=doc_summary(__doc__))
  parser.add_argument("--preset", default="bert-mini", help="a model preset (bertjax.models.presets)")
  parser.add_argument("--config", help="a pretraining experiment config (data is replaced by "
                                       "synthetic batches)")
  parser.add_argument("--batch_size", type=int)
  parser.add_argument("--seq_len", type=int)
  parser.add_argument("--objective")
  parser.add_argument("--lengths", default="full",
                      help="the rows' lengths: full (50-100%% of each row, the default), "
                           "wikitext2 (WikiText-2 paragraphs), wikitext2-articles, or "
                           "ragged:MEAN,MIN (tokens per document); see bertjax/data/ragged.py")
  parser.add_argument("--pack", action=argparse.BooleanOptionalAction,
                      help="with --lengths: pack the documents first-fit into rows with segment "
                           "ids (data.pack), or --no-pack: one per row, padded (default: the "
                           "config's data.pack)")
  parser.add_argument("--steps", type=int, default=10,
                      help="timed steps; 0 compiles the step and reports its memory plan only")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"))
  parser.add_argument("--remat", nargs="?", const="full", choices=("full", "dots"),
                      help="rematerialize each layer: full (keep nothing) or dots (keep the "
                           "weight products' outputs)")
  parser.add_argument("--dropout", type=float,
                      help="override every dropout rate of the model (BERT's two, ModernBERT's "
                           "three)")
  parser.add_argument("--compare", choices=("hf-torch", "hf-torch-compile"),
                      help="time transformers' BertForPreTraining (ModernBertForMaskedLM for "
                           "a ModernBERT model) at the same shapes (eager, or under "
                           "torch.compile)")
  parser.add_argument("--profile", metavar="DIR",
                      help="also trace a few steps with the JAX profiler into DIR and write a "
                           "table of device time per operation (DIR/ops.md, DIR/ops.json)")
  parser.add_argument("--rounds", type=int, default=1,
                      help="with --compare: alternate bertjax and the reference this many times, "
                           "each in its own process, and report the median of the per-round "
                           "ratios; with --checkpoint_cost: rounds of save and restore; with "
                           "--gemm_rate: rounds of the products")
  parser.add_argument("--checkpoint_cost", action="store_true",
                      help="time the save and restore of the model's train state and the digest "
                           "each gets (bertjax/tools/checkpoint_cost.py), medians of --rounds")
  parser.add_argument("--gemm_rate", action="store_true",
                      help="time the step's 2-D matrix products in XLA and in torch, alternately "
                           "in this process (bertjax/tools/gemm_rate.py), medians of --rounds")
  parser.add_argument("--override", action="append", help="extra config override key=value")
  parser.add_argument("--reference_only", action="store_true",
                      help="with --compare: time the reference only (its JSON on the last line)")
  parser.add_argument("--ablate", metavar="SPEC",
                      help="run a set of variants, each in its own process, after the PyTorch "
                           f"reference: a spec file (.py, .json) or one of "
                           f"{', '.join(ablate.NAMED_SETS)} (bertjax/tools/ablate.py)")
  parser.add_argument("--output", help="with --ablate: write the table here (and its figures to "
                                       "the same name with .json)")
  parser.add_argument("--timeout", type=float,
                      help="with --ablate: seconds each variant's process may run (default 900)")
  parser.add_argument("--budget", type=float,
                      help="with --ablate: seconds the whole ablation may take, compilation "
                           "included; processes still running then are stopped, the rows not "
                           "reached marked 'not run', and the table written")
  parser.add_argument("--parallel", type=int,
                      help="with --ablate: variants compiled at once ahead of the timed runs "
                           "(default: min(6, CPU cores))")
  parser.add_argument("--overwrite", action="store_true",
                      help="with --ablate: replace an existing table at --output")
  args = parser.parse_args(argv)
  # 0 read as "not given" ran the config's batch; the config's check then named --config.X,
  # a flag this command does not take.
  for flag in ("batch_size", "seq_len", "rounds"):
    if getattr(args, flag) is not None and getattr(args, flag) < 1:
      fail(f"--{flag} {getattr(args, flag)} must be >= 1; leave it out for the config's value")
  args.length_distribution = ragged.parse(args.lengths)  # a UserError: one line
  if args.dropout is not None and not 0 <= args.dropout < 1:
    fail(f"--dropout {args.dropout:g} must be in [0, 1) (a dropout probability); fix: "
         "--dropout 0.1")
  for item in args.override or ():
    if "=" not in item:
      fail(f"--override {item!r} has no value; write --override {item}=VALUE")
  if args.profile is not None:  # before the timing, not after it (a file there: a traceback)
    paths.check_output_folder(args.profile, "--profile")
  if args.pack is not None and args.length_distribution is None:
    fail("--pack and --no-pack choose how ragged rows are laid out; give --lengths too "
         "(e.g. --lengths wikitext2 --pack)")
  if not (args.ablate or args.checkpoint_cost or args.gemm_rate):
    _check_timing_flags(args)
  return args


def _check_timing_flags(args) -> None:
  """The step timing's flags, refused before anything is built or timed."""
  if args.reference_only:
    if not args.compare:
      fail("--reference_only needs --compare hf-torch or hf-torch-compile")
    return
  if args.steps < 0:
    fail(f"--steps {args.steps}: give 0 (compile only) or more")
  if args.steps == 0 and (args.rounds > 1 or args.compare or args.profile):
    fail("--steps 0 compiles the step without running it; drop --compare, --rounds and --profile "
         "or time some steps")
  if args.rounds > 1 and not args.compare:
    fail("--rounds needs --compare hf-torch or hf-torch-compile (it alternates bertjax and the "
         "reference)")


def load_warning(load: float, cores: int) -> str:
  """'' unless the host's 1-minute load average, read before the timing starts, is above half
  its cores: other work then shares the machine and the figures mean little."""
  if load <= cores / 2:
    return ""
  return (f"warning: the host's load average was {load:.2f} on {cores} cores (above half of "
          "them) when the benchmark started: other work shares this machine, so these figures "
          "mean little; time on an idle host")


def main(argv=None) -> dict:
  args = parse_args(argv)
  if args.ablate:
    return ablate.run_ablation(args.ablate, args.output, args.timeout, args.budget,
                               args.parallel, args.overwrite)
  if (args.output is not None or args.timeout is not None or args.budget is not None
      or args.parallel is not None or args.overwrite):
    fail("--output, --timeout, --budget, --parallel and --overwrite go with --ablate SPEC")
  config = build_config(args)
  if args.length_distribution is not None:
    ragged.check_pack(config, objective_class(config.objective))
  # The load before this process compiles or times anything, said after the figures (a refusal
  # on the way stays the one line it is).
  loaded = load_warning(os.getloadavg()[0], os.cpu_count() or 1)
  result = _measure(args, config, argv)
  if loaded:
    print(loaded, file=sys.stderr, flush=True)
  return result


def _measure(args, config, argv) -> dict:
  """What `main`'s flags ask for, printed, and its figures."""
  if args.checkpoint_cost:
    result = checkpoint_cost.measure(config, max(1, args.rounds), step_setup)
    print(checkpoint_cost.describe(result))
    print(json.dumps(result))
    return result
  if args.gemm_rate:
    result = gemm_rate.measure(config, max(1, args.rounds), step_hlo)
    print(gemm_rate.describe(result))
    print(json.dumps(result))
    return result
  if args.reference_only:
    ref = _torch_subprocess(config, args.steps, args.compare == "hf-torch-compile")
    print(json.dumps(ref))
    return ref
  if args.rounds > 1:
    result = _alternate(config, args, sys.argv[1:] if argv is None else list(argv))
    print(json.dumps(result))
    return result
  # The reference first, while this process holds no device memory (see the module docstring).
  ref = (_torch_subprocess(config, args.steps, args.compare == "hf-torch-compile")
         if args.compare else None)
  result = bench_jax(config, args.steps, profile_dir=args.profile,
                     lengths=args.length_distribution)
  if args.steps == 0:
    temp = result["xla_temp_bytes"]
    print(f"bertjax (compiled, not run): compile {result['compile_time_s']:.1f} s, XLA temporaries "
          + (f"{temp / 2**20:.0f} MiB" if temp is not None else "not reported by this backend"))
    print(json.dumps(result))
    return result
  print(f"bertjax: {result['tokens_per_s']:.0f} tokens/s, step {result['step_time_s'] * 1e3:.1f} ms, "
        f"compile {result['compile_time_s']:.1f} s, MFU {result['mfu'] or float('nan'):.3f} "
        f"({result['peak_source']}), peak memory {result['peak_memory_bytes'] / 2**20:.0f} MiB")
  if args.length_distribution is not None:
    print(f"rows: {result['lengths']}, {'packed' if result['packed'] else 'padded'}: "
          f"{result['real_tokens_per_s']:.0f} real tokens/s, {result['fill']:.1%} of the slots")
  if ref:
    result["reference"] = ref
    result["speedup_vs_reference"] = result["tokens_per_s"] / ref["tokens_per_s"]
    result["memory_ratio_vs_reference"] = result["peak_memory_bytes"] / ref["peak_memory_bytes"]
    print(f"{ref['framework']}: {ref['tokens_per_s']:.0f} tokens/s, "
          f"step {ref['step_time_s'] * 1e3:.1f} ms, "
          f"peak memory {ref['peak_memory_bytes'] / 2**20:.0f} MiB -> speedup "
          f"{result['speedup_vs_reference']:.2f}x")
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  xla_defaults.apply()  # before JAX starts a backend
  signal.signal(signal.SIGTERM, _preempted)  # the ablation installs its own over it
  run_cli(main)
