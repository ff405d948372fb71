"""python -m bertjax.convert from-hf | to-hf (see bertjax.convert)."""

from __future__ import annotations

import sys
from typing import Sequence

from absl import flags

from bertjax.convert import hub
from bertjax.convert.export import convert_to_hf
from bertjax.convert.hf_configs import ELECTRA_PARTS
from bertjax.convert.workdirs import convert_from_hf
from bertjax.core import command_line
from bertjax.core.errors import doc_summary, fail, run_cli
from bertjax.runtime import xla_defaults
import bertjax.convert

PROG = "python -m bertjax.convert"
COMMANDS = {"from-hf": "Hugging Face folder -> bertjax workdir",
            "to-hf": "bertjax workdir -> Hugging Face folder"}


def _from_hf_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_string("model-dir", None, "folder with config.json and model.safetensors",
                      flag_values=fv)
  flags.DEFINE_string("model", None, "a Hugging Face Hub name, ORG/NAME, instead of --model-dir: "
                      "fetched through huggingface_hub's cache (HF_HUB_OFFLINE=1: the cache only)",
                      flag_values=fv)
  flags.DEFINE_string("workdir", None, "a new folder to write (or an empty one)", flag_values=fv)
  flags.DEFINE_enum("part", None, ELECTRA_PARTS, "ELECTRA: which network the folder holds "
                    "(default: detect); 'both' reads MODEL_DIR/discriminator and "
                    "MODEL_DIR/generator", flag_values=fv)


def _to_hf_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_string("workdir", None, "a training workdir, its best/ folder, or a folder "
                      "written by from-hf", flag_values=fv)
  flags.DEFINE_string("output", None, "a new folder to write (or an empty one)", flag_values=fv)
  flags.DEFINE_string("step", None, "training workdir: the checkpoint step to export (default: "
                      "the newest)", flag_values=fv)
  flags.DEFINE_string("include-untrained-heads", "", "comma-separated untrained parts to write "
                      "anyway (mlm, pair, rtd, pooler)", flag_values=fv)


def main(argv: Sequence[str] | None = None) -> None:
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] not in COMMANDS:
    if argv and argv[0] in command_line.HELP_FLAGS:
      print(f"usage: {PROG} from-hf|to-hf [--flag=value ...]\n\n"
            f"{doc_summary(bertjax.convert.__doc__)}\n\ncommands:\n"
            + "\n".join(f"  {name}: {what}" for name, what in COMMANDS.items()))
      raise SystemExit(0)
    given = f" (not {argv[0]!r})" if argv else ""
    fail(f"give a command, {' or '.join(COMMANDS)}{given}; see {PROG} --help")
  command, prog = argv[0], f"{PROG} {argv[0]}"
  define = _from_hf_flags if command == "from-hf" else _to_hf_flags
  required = ["workdir"] if command == "from-hf" else ["workdir", "output"]
  fv, _ = command_line.parse(argv[1:], define, prog=prog, doc=COMMANDS[command] + ".",
                             required=required)
  if command == "from-hf":
    model_dir, name = fv["model-dir"].value, fv.model
    if bool(model_dir) == bool(name):
      fail("from-hf takes one of --model-dir (a local folder) or --model (a Hugging Face Hub "
           "name, ORG/NAME)")
    convert_from_hf(model_dir or hub.snapshot(name), fv.workdir, fv.part)
  else:
    step = fv.step
    if step is not None:
      if not step.isdigit():
        fail(f"--step {step!r} must be a checkpoint step (a whole number); leave it out for "
             "the newest checkpoint")
      step = int(step)
    convert_to_hf(fv.workdir, fv.output, step, fv["include-untrained-heads"].value.split(","))


if __name__ == "__main__":
  xla_defaults.apply()  # before JAX starts a backend
  run_cli(main)
