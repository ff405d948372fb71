"""SQuAD's dev evaluation: the best answer span of every question decoded from the predicted
start and end logits (`bertjax.tasks.squad.decode`) and scored with `bertjax.metrics.squad`.

Each evaluation writes WORKDIR/predictions/step_<N>/predictions.json (official format),
nbest_predictions.json, null_odds.json (v2.0) and metrics.json, scored exactly as
`python -m bertjax.tools.evaluate squad` scores the files.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bertjax.evaluators.base import Evaluator
from bertjax.metrics import squad as squad_eval
from bertjax.tasks import base
from bertjax.tasks.squad import decode, version_of


class SquadEvaluator(Evaluator):
  name = "squad"
  own_task = True

  def run(self, params, step):
    config, c = self.config, self.context
    version = version_of(config)
    dev = c.data.eval_sets[0]
    out = c.predict_rows(params, dev, step)
    nbest, odds = decode(out["start_logits"], out["end_logits"], dev.meta,
                         config.max_answer_length, config.n_best_size)
    examples = dev.meta["examples"]
    threshold = float(config.get("null_score_diff_threshold", 0.0))
    predictions, null_odds, nbest_json = {}, {}, {}
    for ex, entries, o in zip(examples, nbest, odds):
      best = entries[0]["text"] if entries else ""
      # JSON has no infinity: a question without any allowed span gets huge odds instead.
      o = float(o) if np.isfinite(o) else 1e9
      if version == "2.0":
        null_odds[ex["id"]] = o
        if o > threshold:
          best = ""
      predictions[ex["id"]] = best
      nbest_json[ex["id"]] = _with_probabilities(entries)
    if len(predictions) != len(examples):  # repeated ids would collapse; read_squad refuses them
      raise RuntimeError(f"{len(predictions)} predictions for {len(examples)} questions")
    # na_prob_thresh=1.0 is the official script's (and `python -m bertjax.tools.evaluate`'s)
    # default.
    metrics = squad_eval.squad_metrics(examples, predictions,
                                       null_odds=null_odds if version == "2.0" else None,
                                       version=version, na_prob_thresh=1.0)
    metrics = base.finite_metrics(metrics)
    if version == "2.0":
      metrics["null_threshold"] = threshold
    out_dir = c.output_dir(step)
    base.write_json(out_dir / "predictions.json", predictions)
    base.write_json(out_dir / "nbest_predictions.json", nbest_json)
    if version == "2.0":
      base.write_json(out_dir / "null_odds.json", null_odds)
    base.write_json(out_dir / "metrics.json", {"step": step, "version": version, **metrics})
    if version == "2.0":
      answered = sum(bool(p) for p in predictions.values())
      base.announce(f"step {step}: " + v2_headline(metrics, threshold, answered)
                    + f" -> {out_dir}")
    else:
      base.announce(f"step {step}: squad v1.1 dev exact_match {metrics['exact_match']:.2f} "
                    f"f1 {metrics['f1']:.2f} ({len(predictions)} questions) -> {out_dir}")
    yield from metrics.items()


def _with_probabilities(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
  if not entries:
    return entries
  scores = np.asarray([x["score"] for x in entries])
  p = np.exp(scores - scores.max())
  p /= p.sum()
  return [{**x, "probability": float(q)} for x, q in zip(entries, p)]


def v2_headline(metrics: dict[str, float], threshold: float, answered: int) -> str:
  """A SQuAD v2.0 evaluation in one line: its scores at the null threshold used (the default 0
  said as such), how many questions got an answer (all predicted unanswerable said in words),
  and the threshold that would have been best on dev, only where one beats answering none (the
  official sweep reports 0 then: nothing was tuned)."""
  total = int(metrics["total"])
  used = f"null threshold {threshold:g}" + (" (the default, not tuned)" if threshold == 0 else "")
  line = (f"squad v2.0 dev exact {metrics['exact']:.2f} f1 {metrics['f1']:.2f} at {used}; "
          f"{answered} of {total} questions answered")
  if not answered:
    line += (" (every question predicted unanswerable: the model has not learned to answer "
             "yet, or the threshold is too low)")
  abstain = 100.0 * metrics.get("NoAns_total", 0) / total
  if metrics.get("best_f1", abstain) > abstain:
    line += (f"; best on dev: f1 {metrics['best_f1']:.2f} at threshold "
             f"{metrics['best_f1_thresh']:.4f} (set --config.null_score_diff_threshold to use it)")
  else:
    line += (f"; no threshold beats answering none (f1 {abstain:.2f}), so none was tuned on dev")
  return line
