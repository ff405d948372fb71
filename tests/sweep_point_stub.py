"""A stand-in for launch.py as a sweep point (a sweep file's `command`): the same flags, no JAX.

It writes what a run writes that a sweep reads (eval rows in metrics.jsonl at each step, up to
--config.total_steps, a synthetic loss that is best at learning_rate 1e-3; summary.json), stops
on SIGTERM as the trainer does (a checkpoint folder, summary "preempted", exit 75), and records
the environment and CPU cores it was started with and when it ran in WORKDIR/env.json.
BERTJAX_STUB_STEP_S: seconds per step (default 0.1).
"""

import json
import math
import os
import pathlib
import signal
import sys
import time


def main(argv):
  workdir = pathlib.Path(argv[argv.index("--workdir") + 1])
  settings = dict(a.removeprefix("--config.").split("=", 1) for a in argv
                  if a.startswith("--config."))
  total = int(settings.get("total_steps", 8))
  lr = float(settings.get("learning_rate", 1e-3))
  workdir.mkdir(parents=True, exist_ok=True)
  env = {"pid": os.getpid(), "started": time.time(), "cores": sorted(os.sched_getaffinity(0)),
         "environ": {k: v for k, v in os.environ.items()
                     if k.startswith(("CUDA_", "TPU_", "XLA_", "BERTJAX_CPU"))}}
  (workdir / "env.json").write_text(json.dumps(env))
  step = 0

  def stop(signum, frame):
    del signum, frame
    (workdir / "checkpoints" / str(step)).mkdir(parents=True, exist_ok=True)
    (workdir / "summary.json").write_text(json.dumps({"status": "preempted", "step": step}))
    print(f"preempted: SIGTERM at step {step}", flush=True)
    sys.exit(75)

  signal.signal(signal.SIGTERM, stop)
  with open(workdir / "metrics.jsonl", "a", encoding="utf-8") as rows:
    for step in range(1, total + 1):
      time.sleep(float(os.environ.get("BERTJAX_STUB_STEP_S", "0.1")))
      loss = 2.0 + (math.log10(lr) + 3.0) ** 2 + 1.0 / step
      rows.write(json.dumps({"step": step, "split": "eval", "loss": loss}) + "\n")
      rows.flush()
      print(f"eval step {step}/{total}: loss {loss:.4f}", flush=True)
  env["ended"] = time.time()
  (workdir / "env.json").write_text(json.dumps(env))
  (workdir / "summary.json").write_text(json.dumps({"status": "finished", "step": total}))


if __name__ == "__main__":
  main(sys.argv[1:])
