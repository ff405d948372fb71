"""Entry point: `python launch.py --config configs/<exp>.py[:variant] --workdir DIR [--config.key=value ...]`.

All logic lives in importable modules; this file parses flags, loads and locks the config, and
calls `bertjax.train.train_and_evaluate` (or runs a sweep with `--sweep`).
"""

import argparse
import json
import logging
import os
import sys


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", help="configs/<exp>.py[:variant]")
  parser.add_argument("--workdir", required=True, help="where checkpoints, metrics and logs go")
  parser.add_argument("--sweep", help="experiments/<name>.py: run every point of a sweep")
  parser.add_argument("--dry_run", action="store_true", help="with --sweep: list points and commands")
  args, rest = parser.parse_known_args(argv)
  overrides = [r for r in rest if r.startswith("--config.")]
  unknown = [r for r in rest if not r.startswith("--config.")]
  if unknown:
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")
  if not args.config and not args.sweep:
    parser.error("give --config configs/<exp>.py (or --sweep experiments/<name>.py)")
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


def main(argv=None):
  args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
  configure_logging()
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.expanduser("~/.cache/bertjax/jax"))
  from bertjax import config_lib, train  # pylint: disable=g-import-not-at-top
  config = config_lib.load_config_file(args.config)
  config_lib.apply_overrides(config, overrides)
  if config.get("distributed"):
    import jax  # pylint: disable=g-import-not-at-top
    # On Cloud TPU every setting is discovered; on GPU hosts set the coordinator address, process
    # count and id through JAX's environment variables (see experiments/README.md).
    jax.distributed.initialize()
  summary = train.train_and_evaluate(config, args.workdir)
  print("summary: " + json.dumps(summary))


if __name__ == "__main__":
  from bertjax.errors import run_cli  # pylint: disable=g-import-not-at-top
  run_cli(main)
