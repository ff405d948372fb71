"""Scores a predictions file against gold data: `python -m bertjax.tools.evaluate {glue,squad,ner}`.

  glue:  --data the official dev tsv, --predictions a leaderboard tsv (`index<TAB>prediction`);
         --task names the task, else it is taken from the leaderboard file name (RTE.tsv,
         MNLI-mm.tsv, ...) or the gold file's GLUE folder (RTE/dev.tsv, MNLI/dev_matched.tsv).
  squad: --data the official json, --predictions a json {question id: answer text},
         --null_odds (v2.0) a json {question id: null odds}; --task squad_v1/squad_v2 (or
         --version 1.1/2.0) checks the gold file is of that version.
  ner:   --data CoNLL-2003 gold (token POS chunk NER), --predictions `token tag` lines with a
         blank line after each sentence.

Predictions must cover exactly the gold data: a missing index, question id or sentence, or one the
gold file lacks, is refused, as is a file that does not parse (bytes that are not UTF-8 included).
Every file may be local or remote (gs://...).

Prints human-readable lines, then one JSON object with every metric as its last line (NaN, e.g.
a correlation of constant predictions, is written as null). Bad input: one line on stderr, exit 2.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Sequence

from absl import flags

from bertjax.core import command_line, paths
from bertjax.core.errors import fail, run_cli
from bertjax.metrics import glue, ner, squad
from bertjax.runtime import xla_defaults

_SQUAD_TASKS = {"squad": None, "squad_v1": "1.1", "squad1.1": "1.1", "squad_v1.1": "1.1",
                "squad_v2": "2.0", "squad2.0": "2.0", "squad_v2.0": "2.0"}


PROG = "python -m bertjax.tools.evaluate"
BENCHMARKS = ("glue", "squad", "ner")


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_string("data", None, "gold file (GLUE dev tsv, SQuAD json, CoNLL)", flag_values=fv)
  flags.DEFINE_string("predictions", None, "predictions file", flag_values=fv)
  flags.DEFINE_string("task", None, "GLUE task (tfds name, e.g. rte, mnli_mismatched); squad: "
                      "squad_v1/v2", flag_values=fv)
  flags.DEFINE_string("null_odds", None, "SQuAD v2.0: json {id: null odds}", flag_values=fv)
  flags.DEFINE_string("version", None, "SQuAD version the gold file must be", flag_values=fv)
  flags.DEFINE_float("na_prob_thresh", 1.0, "SQuAD v2.0: null odds above this count as 'no "
                     "answer' (official: 1.0)", flag_values=fv)


def _glue_task(args: flags.FlagValues) -> glue.GlueTask:
  if args.task:
    return glue.get_task(args.task)
  t = glue.task_from_leaderboard_file(args.predictions)
  if t is not None:
    return t
  data = paths.absolute(args.data)  # local or remote (gs://...)
  folder, base = data.parent.name, data.name
  for task in glue.GLUE_TASKS.values():
    if task.glue_dir == folder and task.files.get("dev") == base:
      # MNLI's folder holds both dev files; the file name picks matched or mismatched.
      if task.name == "mnli":
        continue
      return task
  fail("cannot tell the GLUE task from the file names; pass --task (e.g. --task rte)")


# Each benchmark's scores keep one scale wherever they are printed or written (these tables, the
# JSON line, a run's metrics.jsonl and summary.json): GLUE's and NER's fractions, SQuAD's percent
# (its official script's). The tables say which.
FRACTIONS = "scores as fractions (0-1), as in the JSON line and a run's rows"
PERCENT = ("exact and f1 scores in percent (0-100), as the official SQuAD script and a run's "
           "rows give them")


def _evaluate_glue(args: flags.FlagValues) -> dict[str, Any]:
  t = _glue_task(args)
  gold = glue.read_glue_tsv(args.data, t.name, "dev")
  index, preds = glue.read_predictions_tsv(args.predictions, t.name)
  gold_idx = [row["idx"] for row in gold]
  pred_pos = {int(i): k for k, i in enumerate(index.tolist())}
  missing = [i for i in gold_idx if i not in pred_pos]
  if missing:
    first = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
    fail(f"{args.predictions} lacks predictions for {len(missing)} of {len(gold)} gold "
         f"indices (first: {first}); write one row per dev example")
  extra = sorted(set(pred_pos) - set(gold_idx))
  if extra:
    first = ", ".join(map(str, extra[:5])) + (", ..." if len(extra) > 5 else "")
    fail(f"{args.predictions} has {len(extra)} indices not in the gold file (first: {first}); "
         "is it a prediction file for another split or task?")
  ordered = preds[[pred_pos[i] for i in gold_idx]]
  metrics = glue.glue_metrics(t.name, ordered, [row["label"] for row in gold])
  print(f"GLUE {t.name}: {len(gold)} dev examples; {FRACTIONS}")
  for name, value in metrics.items():
    print(f"  {name:<10} {value:8.4f}")
  score = glue.glue_task_score(t.name, metrics)
  print(f"  {'score':<10} {score:8.4f}")
  return {"benchmark": "glue", "task": t.name, "num_examples": len(gold), **metrics,
          "score": score}


def _evaluate_squad(args: flags.FlagValues) -> dict[str, Any]:
  version = args.version
  if args.task:
    key = args.task.strip().lower()
    if key not in _SQUAD_TASKS:
      fail(f"unknown SQuAD task {args.task!r}; use squad_v1 or squad_v2 (or leave --task out)")
    if _SQUAD_TASKS[key] and version and squad.normalize_version(version) != _SQUAD_TASKS[key]:
      fail(f"--task {args.task} and --version {version} disagree; pass one of them")
    version = version or _SQUAD_TASKS[key]
  found, examples = squad.read_squad(args.data, version=version)
  if not examples:
    fail(f"{args.data} has no questions; pass the SQuAD dev json the predictions are for")
  predictions = squad.read_squad_predictions(args.predictions, "predictions")
  squad.check_prediction_file(args.predictions, predictions, examples, "predictions")
  null_odds = None
  if args.null_odds:
    if found != "2.0":
      fail(f"{args.data} is SQuAD v{found}; null odds apply to v2.0 only: drop --null_odds")
    null_odds = squad.read_squad_predictions(args.null_odds, "null odds")
    squad.check_prediction_file(args.null_odds, null_odds, examples, "null odds", numbers=True)
  metrics = squad.squad_metrics(examples, predictions, null_odds=null_odds, version=found,
                                na_prob_thresh=args.na_prob_thresh)
  print(f"SQuAD v{found}: {len(examples)} questions; {PERCENT}")
  for name, value in metrics.items():
    print(f"  {name:<18} {value:10.4f}" if isinstance(value, float) else f"  {name:<18} {value}")
  return {"benchmark": "squad", "version": found, **metrics}


def _evaluate_ner(args: flags.FlagValues) -> dict[str, Any]:
  gold = ner.read_conll(args.data)
  if not gold:
    fail(f"{args.data} has no sentences; pass the CoNLL-2003 gold file the predictions are for")
  predicted = ner.read_ner_predictions(args.predictions)
  pred_tags = ner.align_predictions(gold, predicted, args.predictions)
  metrics = ner.ner_metrics([s.tags for s in gold], pred_tags)
  print(f"NER: {len(gold)} sentences, {metrics['num_gold']} gold entities, "
        f"{metrics['num_predicted']} predicted, {metrics['num_correct']} correct; {FRACTIONS}")
  print(f"  {'type':<8} {'precision':>9} {'recall':>9} {'f1':>9} {'support':>8}")
  for t, m in metrics["per_type"].items():
    print(f"  {t:<8} {m['precision']:9.4f} {m['recall']:9.4f} {m['f1']:9.4f} {m['support']:8d}")
  print(f"  {'overall':<8} {metrics['precision']:9.4f} {metrics['recall']:9.4f} "
        f"{metrics['f1']:9.4f} {metrics['num_gold']:8d}")
  return {"benchmark": "ner", "num_sentences": len(gold), **metrics}


def _json_safe(obj: Any) -> Any:
  """NaN/inf are not JSON: write them as null."""
  if isinstance(obj, float) and not math.isfinite(obj):
    return None
  if isinstance(obj, dict):
    return {k: _json_safe(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_json_safe(v) for v in obj]
  return obj


def _check_files(args: flags.FlagValues) -> None:
  """A folder where a file is wanted is called one (the readers said "file not found")."""
  for flag in ("data", "predictions", "null_odds"):
    value = getattr(args, flag)
    if value and paths.as_path(value).is_dir():
      fail(f"--{flag} {value} is a folder, not a file; pass the {flag.replace('_', ' ')} file "
           "in it")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  (args, [benchmark]) = command_line.parse(
      sys.argv[1:] if argv is None else argv, define_flags, prog=PROG, doc=__doc__,
      positional=["{glue,squad,ner}"], required=["data", "predictions"])
  if benchmark not in BENCHMARKS:
    fail(f"invalid choice {benchmark!r}: the benchmark is one of {', '.join(BENCHMARKS)}; see "
         f"{PROG} --help")
  _check_files(args)
  evaluate = {"glue": _evaluate_glue, "squad": _evaluate_squad, "ner": _evaluate_ner}
  result = evaluate[benchmark](args)
  print(json.dumps(_json_safe(result), sort_keys=False))
  sys.stdout.flush()
  return result


if __name__ == "__main__":
  xla_defaults.apply()  # before JAX starts a backend
  run_cli(main)
