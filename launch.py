"""Entry point: `python launch.py --config configs/<exp>.py[:variant] --workdir DIR [--config.key=value ...]`.

All logic lives in importable modules; this file parses flags, loads and locks the config, and
calls `bertjax.trainer.train.train_and_evaluate` (or runs a sweep with `--sweep`).
"""

import logging
import os
import signal
import sys
import types
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
from absl import flags

from bertjax import sweep
from bertjax.config import config_lib
from bertjax.core import command_line, paths
from bertjax.core.errors import EXIT_INTERRUPTED, EXIT_PREEMPTED, doc_summary, fail, run_cli
from bertjax.runtime import distributed, progress, xla_defaults
from bertjax.runtime.preemption import GO_ON, Preemption
from bertjax.tools import multiseed
from bertjax.trainer import dry_run, train
# pylint: enable=wrong-import-position

xla_defaults.apply()  # the opt-in XLA:CPU flags, before JAX starts a backend


USAGE = ("python launch.py --config configs/<exp>.py[:variant] --workdir DIR "
         "[--config.key=value ...]")


def define_flags(argv) -> flags.FlagValues:
  """launch.py's absl flags; `--config` is ml_collections' config file flag (`file.py[:variant]`,
  the variant passed to `get_config`)."""
  fv = flags.FlagValues()
  command_line.define_config_file(fv, argv, "configs/<exp>.py[:variant]; then --config.key=value "
                                  "sets one of its settings", config_lib.load_config_file)
  flags.DEFINE_string("workdir", None, "where checkpoints, metrics and logs go", flag_values=fv)
  flags.mark_flag_as_required("workdir", flag_values=fv)
  flags.DEFINE_string("sweep", None, "experiments/<name>.py: run every point of a sweep",
                      flag_values=fv)
  flags.DEFINE_bool("dry_run", False, "with --sweep: list points and commands; with --config: "
                    "check one run's settings, inputs and step memory on this machine's devices "
                    "and write nothing", flag_values=fv)
  flags.DEFINE_string("tpu", None, "with --sweep: run every point on all workers of this TPU VM",
                      flag_values=fv)
  flags.DEFINE_string("zone", None, "with --tpu: the TPU VM's zone", flag_values=fv)
  flags.DEFINE_string("project", None, "with --tpu: the TPU VM's Google Cloud project",
                      flag_values=fv)
  flags.DEFINE_string("hosts", None, "with --sweep: h1,h2: one process per ssh host (GPU hosts)",
                      flag_values=fv)
  flags.DEFINE_integer("local_processes", None, "with --sweep: run each point on N local CPU "
                       "processes joined by JAX's distributed runtime (bertjax.tools.multihost)",
                       flag_values=fv)
  flags.DEFINE_integer("devices_per_process", None, "with --local_processes: CPU devices each "
                       "process fakes", flag_values=fv)
  flags.DEFINE_integer("max_concurrent", 1, "with --sweep: run up to N points here at once, each "
                       "on its own slice of the devices (GPUs, TPU chips or CPU cores)",
                       flag_values=fv)
  return fv


def parse_args(argv):
  """(flag values, `--config.key=value` overrides). `args.config` is the locked ConfigDict that
  config_flags loaded (None with --sweep); the overrides are applied by config_lib (its typing
  rules and typo hints; ARCHITECTURE.md says why)."""
  try:
    argv = flags.FlagValues().read_flags_from_files(["launch.py", *argv], force_gnu=False)
    overrides = [a for a in argv if a.startswith("--config.")]  # a --flagfile's lines too
    argv = [a for a in argv if not a.startswith("--config.")]
    fv = define_flags(argv)
    if {"--help", "-h", "--helpfull"} & set(argv):
      print(f"usage: {USAGE}\n\n{doc_summary(__doc__)}\n\n{fv.get_help()}")
      sys.exit(0)
    rest = fv(argv)
  except flags.Error as e:
    fail(f"{' '.join(str(e).split()).rstrip('.')}; see launch.py --help")
  if rest[1:]:
    fail(f"unrecognized arguments: {' '.join(rest[1:])}; see launch.py --help")
  args = types.SimpleNamespace(**fv.flag_values_dict())
  if args.config is None and not args.sweep:
    fail("give --config configs/<exp>.py (or --sweep experiments/<name>.py)")
  if args.sweep and args.config is not None:
    fail("--sweep takes the config from the sweep file; drop --config")
  if not args.sweep and (args.tpu or args.hosts or args.local_processes
                         or args.devices_per_process or args.max_concurrent != 1):
    fail("--tpu, --hosts, --local_processes and --max_concurrent go with --sweep "
         "experiments/<name>.py "
         "(one run on several local processes: python -m bertjax.tools.multihost)")
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
  """The one line on stderr of a run a SIGTERM or a Ctrl-C stopped after training steps: where,
  and how to go on."""
  head = ("interrupted: Ctrl-C" if str(summary.get("status", "")).startswith("interrupted")
          else "preempted: SIGTERM")
  return (f"{head} at step {summary.get('step', '?')}; checkpoint "
          f"{summary.get('checkpoint') or 'none'} saved; {GO_ON}")


def main(argv=None):
  with Preemption() as loading, loading.abandoning("loading the config (nothing was written)"):
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)  # loads --config
  paths.check_output_folder(args.workdir)  # before anything is loaded, prepared or written
  configure_logging()
  if xla_defaults.onednn_active():
    # On CPUs the oneDNN matmuls cannot be cached (bertjax/runtime/xla_defaults.py); say nothing per
    # step.
    warnings.filterwarnings("ignore", message="Error writing persistent compilation cache entry")
  if args.sweep:
    if signal.getsignal(signal.SIGTERM) is _preempted_while_loading:
      signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the sweep's runs handle their own
    record = sweep.run_sweep(args.sweep, args.workdir, dry_run=args.dry_run, tpu=args.tpu,
                             zone=args.zone, project=args.project, hosts=args.hosts,
                             overrides=overrides, local_processes=args.local_processes,
                             devices_per_process=args.devices_per_process,
                             max_concurrent=args.max_concurrent)
    sys.exit(1 if record["failed"] else 0)
  # From here to the end a SIGTERM stops the run as preempted (exit 75, one line; see
  # bertjax/runtime/preemption.py); a sweep's runs are processes of their own. After it the process
  # is ending with the run's status: a SIGTERM then is ignored.
  with Preemption(last=True) as preemption:
    with preemption.abandoning("loading the config (nothing was written)"):
      config = args.config  # loaded and locked by the --config flag
      config_lib.apply_overrides(config, overrides)
      if distributed.requested_processes() > 1 and not config.get("distributed"):
        fail(f"JAX_NUM_PROCESSES={distributed.requested_processes()} asks for several processes; "
             "add --config.distributed=True to the command of every process")
      if config.get("distributed"):
        # On Cloud TPU every setting is discovered; on GPU hosts and bertjax.tools.multihost the
        # coordinator address, process count and id come in JAX's environment variables (see
        # experiments/README.md). One run, one config: the processes compare theirs.
        distributed.initialize()
        distributed.check_same_config(config)
    if args.dry_run:  # one run's start, short of its first step; nothing written
      line = dry_run.dry_run(config, args.workdir)
      if jax.process_index() == 0:
        print(line, flush=True)
      return
    if config.get("seeds"):  # several seeds: one run each into WORKDIR/seed_<n>
      summary = multiseed.run_seeds(config, args.workdir)
    else:
      summary = train.train_and_evaluate(config, args.workdir)
    if jax.process_index() == 0:  # the other processes of a multi-host run wrote nothing
      print(end_lines(summary, args.workdir), flush=True)
  status = str(summary.get("status", ""))
  if not status.startswith(("preempted", "interrupted")) and preemption.requested:
    status = "interrupted" if preemption.name == "Ctrl-C" else "preempted"
  if status.startswith(("preempted", "interrupted")):  # saved: the same command goes on
    print(preempted_line({**summary, "status": status}), file=sys.stderr, flush=True)
    sys.exit(EXIT_INTERRUPTED if status.startswith("interrupted") else EXIT_PREEMPTED)


if __name__ == "__main__":
  # Several processes: one failing alone ends every one at once (bertjax/runtime/distributed.py).
  run_cli(lambda: distributed.run_main(main))
