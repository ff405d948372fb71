"""python -m bertjax.convert from-hf | to-hf (see bertjax.convert)."""

from __future__ import annotations

import argparse

from bertjax.convert.export import convert_to_hf
from bertjax.convert.hf_configs import ELECTRA_PARTS
from bertjax.convert.workdirs import convert_from_hf
from bertjax.core.errors import doc_summary, fail, run_cli
from bertjax.runtime import xla_defaults
import bertjax.convert



# ----------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m bertjax.convert",
                                   description=doc_summary(bertjax.convert.__doc__))
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("from-hf", help="Hugging Face folder -> bertjax workdir")
  p.add_argument("--model-dir", required=True, help="folder with config.json and model.safetensors")
  p.add_argument("--workdir", required=True, help="a new folder to write (or an empty one)")
  p.add_argument("--part", choices=ELECTRA_PARTS, default=None,
                 help="ELECTRA: which network the folder holds (default: detect); 'both' reads "
                      "MODEL_DIR/discriminator and MODEL_DIR/generator")
  p = sub.add_parser("to-hf", help="bertjax workdir -> Hugging Face folder")
  p.add_argument("--workdir", required=True,
                 help="a training workdir, its best/ folder, or a folder written by from-hf")
  p.add_argument("--output", required=True, help="a new folder to write (or an empty one)")
  p.add_argument("--step", default=None,
                 help="training workdir: the checkpoint step to export (default: the newest)")
  p.add_argument("--include-untrained-heads", default="", metavar="PARTS",
                 help="comma-separated untrained parts to write anyway (mlm, pair, rtd, pooler)")
  args = parser.parse_args(argv)
  if args.command == "from-hf":
    convert_from_hf(args.model_dir, args.workdir, args.part)
  else:
    step = args.step
    if step is not None:
      if not step.isdigit():
        fail(f"--step {step!r} must be a checkpoint step (a whole number); leave it out for "
             "the newest checkpoint")
      step = int(step)
    convert_to_hf(args.workdir, args.output, step, args.include_untrained_heads.split(","))


if __name__ == "__main__":
  xla_defaults.apply()  # before JAX starts a backend
  run_cli(main)
