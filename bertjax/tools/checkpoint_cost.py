"""What a checkpoint's digest costs: `python -m bertjax.tools.benchmark --checkpoint_cost`.

  python -m bertjax.tools.benchmark --checkpoint_cost --preset bert-base --rounds 3

Saves and restores the whole train state a run checkpoints (params, Adam moments, step) with
orbax in a temporary local folder, and times apart the two things bertjax/core/digests.py adds: the
digest written after the save and checked before the restore. Each figure is the median of
`rounds`. The files are then in the page cache, as they are right after a save; a restore from a
cold disk reads them once for the check and finds them cached for orbax.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from bertjax.core import digests, paths
from bertjax.runtime import checkpoints


def _timed(fn) -> tuple[float, object]:
  t = time.perf_counter()
  out = fn()
  return time.perf_counter() - t, out


def measure(config, rounds: int, step_setup) -> dict:
  """Seconds (medians of `rounds`) of orbax's save and restore of the train state of `config`'s
  model, and of the digest's write and check; the checkpoint's size. The state is the one the
  trainer builds after its checks: `step_setup(config)`, bertjax/tools/benchmark.py's."""
  _, cfg, _, _, state = step_setup(config)
  # Fresh Adam moments are zeros, which orbax's compression shrinks to nothing; a trained run's
  # are not: random values of their shapes give the checkpoint a trained run's size.
  rng = np.random.default_rng(0)
  state = state.replace(opt_state=jax.tree.map(
      lambda x: jax.device_put(rng.standard_normal(x.shape).astype(x.dtype), x.sharding)
      if jnp.issubdtype(x.dtype, jnp.floating) else x, state.opt_state))
  jax.block_until_ready(state)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          state)
  times = {"save_s": [], "digest_write_s": [], "restore_s": [], "digest_check_s": []}
  size = 0
  with tempfile.TemporaryDirectory(prefix="bertjax-checkpoint-cost-") as tmp:
    ckpt = checkpoints.Checkpointer(tmp, keep=1, async_save=False)
    try:
      for step in range(1, rounds + 1):
        args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                                  data=ocp.args.JsonSave({"round": step}))
        save_s, _ = _timed(lambda: (ckpt.manager.save(step, args=args, force=True),
                                    ckpt.manager.wait_until_finished()))
        folder = paths.as_path(tmp) / str(step)
        write_s, _ = _timed(lambda: digests.write(folder))
        check_s, _ = _timed(lambda: digests.verify(folder))
        restore_args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                          data=ocp.args.JsonRestore())
        restore_s, _ = _timed(lambda: jax.block_until_ready(
            ckpt.manager.restore(step, args=restore_args)["state"]))
        for key, value in zip(times, (save_s, write_s, restore_s, check_s)):
          times[key].append(value)
        size = sum(entry["size"] for entry in digests.compute(folder).values())
    finally:
      ckpt.close()
  result = {key: statistics.median(values) for key, values in times.items()}
  return {"hidden_size": cfg.hidden_size, "num_layers": cfg.num_hidden_layers,
          "checkpoint_bytes": size, "rounds": rounds, "device": jax.devices()[0].platform,
          **result,
          "save_overhead": result["digest_write_s"] / result["save_s"],
          "restore_overhead": result["digest_check_s"] / result["restore_s"]}


def describe(result: dict) -> str:
  """One line of the figures, for the terminal."""
  return (f"checkpoint {result['checkpoint_bytes'] / 2**30:.2f} GiB: save "
          f"{result['save_s']:.2f} s + digest {result['digest_write_s']:.2f} s "
          f"(+{100 * result['save_overhead']:.0f}%), restore {result['restore_s']:.2f} s + check "
          f"{result['digest_check_s']:.2f} s (+{100 * result['restore_overhead']:.0f}%); medians "
          f"of {result['rounds']} rounds")
