"""Prunes a fine-tuned model in steps: `python -m bertjax.prune --workdir RUN --output OUT ...`.

  python -m bertjax.prune --workdir runs/sst2 --output runs/sst2_pruned --target-heads 0.5 \
      --steps 4 --finetune-steps 100          # heads, Michel et al.'s importance, global ranking
  python -m bertjax.prune ... --target-layers 0.5       # also (or only) whole layers
  python -m bertjax.prune ... --target-sparsity 0.6 --sparsity-scope layer   # weights, magnitude

RUN is a fine-tuning workdir (launch.py with a GLUE/SQuAD/CoNLL config); its best/ parameters
(the best evaluation by its best_metric) are pruned where it keeps them, else its latest
checkpoint, scored and evaluated on its own dev set; a line says which was taken. OUT (new) receives per step the pruned model
(OUT/step_<j>/pruned: model.json, naming the task head under "task", params/, tokenizer/;
`--config.init_from`, `bertjax.load` and `python -m bertjax.convert to-hf` read it with its head) and its brief re-fine-tuning (OUT/step_<j>/finetuned),
and pruning.md / pruning.csv / pruning.png / summary.json: the dev metric against the heads (or
sparsity) kept. `--override key=value` changes the re-fine-tuning's config (e.g.
learning_rate=1e-4). RUN and OUT may be remote (gs://...): a remote OUT is written in a local
temporary folder and uploaded at the end.
"""

from __future__ import annotations

import json
import shlex
import sys
from typing import Sequence

from bertjax.config import config_lib
from bertjax.core import paths
from bertjax.core.errors import ArgumentParser, UserError, doc_summary, fail, run_cli
from bertjax.prune import flow, magnitude, table
from bertjax.prune.session import Session, read_run_config
from bertjax.runtime import checkpoints, xla_defaults


def _parser() -> ArgumentParser:
  p = ArgumentParser(prog="python -m bertjax.prune", description=doc_summary(__doc__))
  p.add_argument("--workdir", required=True, help="a fine-tuning run to prune")
  p.add_argument("--output", required=True, help="a new folder for the pruned models and report")
  p.add_argument("--target-heads", type=float, default=1.0, help="fraction of heads kept")
  p.add_argument("--target-layers", type=float, default=1.0, help="fraction of layers kept")
  p.add_argument("--target-sparsity", type=float, default=0.0,
                 help="fraction of the encoder layers' kernel weights set to zero")
  p.add_argument("--sparsity-scope", choices=magnitude.SCOPES, default="global",
                 help="rank weights by magnitude over all layers at once, or within each layer")
  p.add_argument("--steps", type=int, default=1, help="prune in this many equal steps")
  p.add_argument("--finetune-steps", type=int, default=0,
                 help="fine-tuning steps after each pruning step (0: none)")
  p.add_argument("--ranking", choices=flow.RANKINGS, default="importance",
                 help="which heads/layers go first: Michel et al.'s importance, or random (a control)")
  p.add_argument("--seed", type=int, default=0, help="the random ranking's seed")
  p.add_argument("--metric", default=None, help="dev metric to report (default: the run's best_metric)")
  p.add_argument("--override", action="append", default=[], help="key=value for the fine-tuning")
  return p


def main(argv: Sequence[str] | None = None) -> list[dict]:
  argv = list(sys.argv[1:] if argv is None else argv)
  args = _parser().parse_args(argv)
  plan = flow.Plan(args.target_heads, args.target_layers, args.target_sparsity,
                   args.sparsity_scope, args.steps, args.finetune_steps, args.ranking, args.seed)
  plan.check()
  if args.override and args.finetune_steps == 0:
    fail(f"--override {args.override[0]} changes the re-fine-tuning, which --finetune-steps 0 "
         "(the default) leaves out; fix: add --finetune-steps N, or drop --override")
  paths.check_output_folder(args.output, "--output")
  out = paths.absolute(args.output)
  if out.exists() and any(out.iterdir()):
    fail(f"--output {out} exists and is not empty; give a new folder")
  workdir = paths.as_path(args.workdir)
  if not workdir.is_dir():
    fail(f"--workdir {args.workdir} does not exist; point it at a fine-tuning run")
  if (workdir / "model.json").is_file():
    fail(f"--workdir {args.workdir} is a model folder (model.json), not a run: fine-tune it "
         f"(--config.init_from={args.workdir}) and prune that run; for OUT/step_N/pruned, "
         "prune OUT/step_N/finetuned")
  if not any((workdir / d).is_dir() for d in ("checkpoints", "params")):
    fail(f"--workdir {args.workdir} holds no checkpoints/; point it at a fine-tuning run that "
         "saved a checkpoint")
  # A bad --override key or value: one line before OUT is made, not after the first evaluation.
  try:
    config_lib.apply_overrides(read_run_config(paths.absolute(args.workdir)), args.override)
  except UserError as e:  # its line names launch.py's flag, --config.KEY=VALUE
    fail(str(e).replace("--config.", "--override "))
  params, taken = starting_params(args.workdir)  # fails with one line before OUT is made
  print(taken, flush=True)
  tokenizer = paths.as_path(args.workdir) / "tokenizer"
  tokenizer = paths.reading(tokenizer) if tokenizer.is_dir() else None
  # A remote OUT is written in a local folder and uploaded when every step is done.
  with paths.writing(out) as local:
    local.mkdir(parents=True, exist_ok=True)
    session = Session.open(args.workdir, local, args.metric)
    rows = flow.run(session, plan, params, tokenizer, args.override)
    command = "python -m bertjax.prune " + " ".join(shlex.quote(a) for a in argv)
    text = table.write_all(local, rows, session.metric, command, not plan.structured)
  print(text)
  print(f"wrote {out / 'pruning.md'}, pruning.csv, pruning.png, summary.json")
  return rows


def starting_params(workdir: str) -> tuple[dict, str]:
  """The parameters pruning starts from, and the line saying which: the run's best/ (what its
  best_metric kept) where there is one, else its newest checkpoint (a params/ folder as given)."""
  run = paths.as_path(workdir)
  best = checkpoints.best_params(run / "best") if (run / "best").is_dir() else None
  if best is not None:
    try:
      record = json.loads((run / "best" / "best.json").read_text())
    except (OSError, ValueError):  # damaged: best_params has warned; its folder is still named
      record = {}
    return checkpoints.restore_params_folder(best), (
        f"pruning {best}: the best evaluation ({record.get('metric')} {record.get('value')} at "
        f"step {record.get('step')}), not the newest checkpoint")
  if (run / "checkpoints").is_dir():
    step, params = checkpoints.restore_checkpoint_params(run)
    return params, (f"pruning the newest checkpoint of {run} (step {step}): the run keeps no "
                    "best/ (it had no best_metric or no evaluation)")
  return checkpoints.restore_params(run), f"pruning {run / 'params'}"


if __name__ == "__main__":
  xla_defaults.apply()  # before JAX starts a backend
  run_cli(main)
