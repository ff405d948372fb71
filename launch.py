"""Entry point: `python launch.py --config configs/<exp>.py[:variant] --workdir DIR [--config.key=value ...]`.

All logic lives in importable modules; this file parses flags, loads and locks the config, and
calls `bertjax.train.train_and_evaluate` (or runs a sweep with `--sweep`).
"""

import argparse
import logging
import os
import signal
import sys
import warnings


def _preempted_while_loading(signum, frame):
  """SIGTERM before `main` installs the run's handler: nothing was written yet."""
  del signum, frame
  print("preempted: SIGTERM while loading the libraries (nothing was written); run the same "
        "command again to go on", file=sys.stderr, flush=True)
  sys.exit(75)  # errors.EXIT_PREEMPTED, not imported yet


if __name__ == "__main__":  # from the first line on: importing JAX takes seconds
  signal.signal(signal.SIGTERM, _preempted_while_loading)

# Read by JAX when it is imported (below): compiled steps are cached across runs, so a resumed or
# repeated run skips most compilation.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.expanduser("~/.cache/bertjax/jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

# pylint: disable=wrong-import-position
import jax

from bertjax import (config_lib, distributed, multiseed, paths, progress, sweep, train,
                     xla_defaults)
from bertjax.errors import EXIT_PREEMPTED, doc_summary, run_cli
from bertjax.preemption import GO_ON, Preemption
# pylint: enable=wrong-import-position

xla_defaults.apply()  # the opt-in XLA:CPU flags, before JAX starts a backend


def parse_args(argv):
  parser = argparse.ArgumentParser(description=doc_summary(__doc__))
  parser.add_argument("--config", help="configs/<exp>.py[:variant]")
  parser.add_argument("--workdir", required=True, help="where checkpoints, metrics and logs go")
  parser.add_argument("--sweep", help="experiments/<name>.py: run every point of a sweep")
  parser.add_argument("--dry_run", action="store_true", help="with --sweep: list points and commands")
  parser.add_argument("--tpu", help="with --sweep: run every point on all workers of this TPU VM")
  parser.add_argument("--zone", help="with --tpu: the TPU VM's zone")
  parser.add_argument("--project", help="with --tpu: the TPU VM's Google Cloud project")
  parser.add_argument("--hosts", help="with --sweep: h1,h2: one process per ssh host (GPU hosts)")
  args, rest = parser.parse_known_args(argv)
  overrides = [r for r in rest if r.startswith("--config.")]
  unknown = [r for r in rest if not r.startswith("--config.")]
  if unknown:
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")
  if not args.config and not args.sweep:
    parser.error("give --config configs/<exp>.py (or --sweep experiments/<name>.py)")
  if args.sweep and args.config:
    parser.error("--sweep takes the config from the sweep file; drop --config")
  if not args.sweep and (args.dry_run or args.tpu or args.hosts):
    parser.error("--dry_run, --tpu and --hosts go with --sweep experiments/<name>.py")
  return args, overrides


def configure_logging():
  """INFO lines from bertjax itself; only warnings and errors from the libraries beneath it."""
  package_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bertjax")
  handler = logging.StreamHandler()
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
  handler.addFilter(lambda r: r.levelno >= logging.WARNING or r.pathname.startswith(package_dir))
  root = logging.getLogger()
  root.handlers[:] = [handler]
  root.setLevel(logging.INFO)


def end_lines(summary, workdir) -> str:
  """What a run prints at its end; every path absolute, as the summary's workdir and checkpoint
  are."""
  where = paths.absolute(workdir)
  if "first_train" in summary:
    return progress.end_table({**summary, "workdir": str(where)}, where / "summary.json")
  return f"summary: {where / 'seeds_summary.json'}"  # several seeds: their spread is logged above


def preempted_line(summary) -> str:
  """The one line on stderr of a run a SIGTERM stopped after training steps: where, and how to
  go on."""
  return (f"preempted: SIGTERM at step {summary.get('step', '?')}; checkpoint "
          f"{summary.get('checkpoint') or 'none'} saved; {GO_ON}")


def main(argv=None):
  args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
  paths.check_output_folder(args.workdir)  # before anything is loaded, prepared or written
  configure_logging()
  if xla_defaults.onednn_active():
    # On CPUs the oneDNN matmuls cannot be cached (bertjax/xla_defaults.py); say nothing per step.
    warnings.filterwarnings("ignore", message="Error writing persistent compilation cache entry")
  if args.sweep:
    if signal.getsignal(signal.SIGTERM) is _preempted_while_loading:
      signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the sweep's runs handle their own
    record = sweep.run_sweep(args.sweep, args.workdir, dry_run=args.dry_run, tpu=args.tpu,
                             zone=args.zone, project=args.project, hosts=args.hosts,
                             overrides=overrides)
    sys.exit(1 if record["failed"] else 0)
  # From here to the end a SIGTERM stops the run as preempted (exit 75, one line; see
  # bertjax/preemption.py); a sweep's runs are processes of their own.
  with Preemption() as preemption:
    with preemption.abandoning("loading the config (nothing was written)"):
      config = config_lib.load_config_file(args.config)
      config_lib.apply_overrides(config, overrides)
      if config.get("distributed"):
        # On Cloud TPU every setting is discovered; on GPU hosts set the coordinator address,
        # process count and id through JAX's environment variables (see experiments/README.md).
        jax.distributed.initialize(**distributed.jax_distributed_kwargs())
    if config.get("seeds"):  # several seeds: one run each into WORKDIR/seed_<n>
      summary = multiseed.run_seeds(config, args.workdir)
    else:
      summary = train.train_and_evaluate(config, args.workdir)
    print(end_lines(summary, args.workdir), flush=True)
  if str(summary.get("status", "")).startswith("preempted") or preemption.requested:
    print(preempted_line(summary), file=sys.stderr, flush=True)
    sys.exit(EXIT_PREEMPTED)  # a checkpoint was saved: the same command goes on


if __name__ == "__main__":
  run_cli(main)
