"""CoNLL-2003 tagging's dev evaluation: a tag for every word from the position its row labels,
scored at the entity level for NER (`bertjax.metrics.ner`, conlleval semantics) and by token
accuracy for POS.

Each evaluation writes WORKDIR/predictions/step_<N>/dev_predictions.txt (`token tag` lines, a
blank line after each sentence: what `python -m bertjax.tools.evaluate ner` scores) and
metrics.json; the final one also predicts and scores the test file when there is one.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from bertjax.evaluators.base import Evaluator
from bertjax.metrics import ner as ner_eval
from bertjax.tasks import base
from bertjax.tasks.ner import TaggingTask, task_of


class TaggingEvaluator(Evaluator):
  name = "ner"
  own_task = True

  def run(self, params, step):
    config, c = self.config, self.context
    task = task_of(config)
    out_dir = c.output_dir(step)
    dev = c.data.eval_sets[0]
    metrics, tags = self._score(dev, params, step)
    path = out_dir / "dev_predictions.txt"
    if jax.process_index() == 0:
      ner_eval.write_ner_predictions(path, [w for w, _ in dev.meta["sentences"]], tags)
    main = TaggingTask.main_metric(config)
    lines = [f"{task} dev {main} {metrics[main]:.4f} ({metrics['sentences']} sentences) "
             f"-> {path}"]
    record = {"step": step, "task": task, "dev": metrics}
    if c.is_final(step):
      for s in c.data.test_sets:
        test_metrics, test_tags = self._score(s, params, step)
        test_path = out_dir / "test_predictions.txt"
        if jax.process_index() == 0:
          ner_eval.write_ner_predictions(test_path, [w for w, _ in s.meta["sentences"]],
                                         test_tags)
        record["test"] = test_metrics
        metrics.update({f"test_{k}": v for k, v in test_metrics.items()
                        if k in ("f1", "precision", "recall", "accuracy")})
        lines.append(f"{task} test {main} {test_metrics[main]:.4f} "
                     f"({test_metrics['sentences']} sentences) -> {test_path}")
    base.write_json(out_dir / "metrics.json", record)
    for line in lines:
      base.announce(f"step {step}: {line}")
    yield from base.finite_metrics(metrics).items()

  def _score(self, eval_set: base.EvalSet, params, step: int) -> tuple[dict[str, Any], list]:
    out = self.context.predict_rows(params, eval_set, step)
    tags = tags_of(eval_set, out["predicted"])
    gold = [t for _, t in eval_set.meta["sentences"]]
    n_tokens = float(out["labelled"].sum())
    metrics: dict[str, Any] = {"accuracy": float(out["correct"].sum()) / max(n_tokens, 1.0),
                               "loss": float(out["loss"].sum()) / max(n_tokens, 1.0),
                               "sentences": len(gold)}
    if eval_set.meta["task"] == "ner":
      m = ner_eval.ner_metrics(gold, tags)
      metrics.update({k: m[k] for k in ("precision", "recall", "f1", "num_gold", "num_predicted",
                                        "num_correct")})
      metrics.update({f"f1_{t}": v["f1"] for t, v in m["per_type"].items()})
    return metrics, tags


def tags_of(eval_set: base.EvalSet, predicted: np.ndarray) -> list[list[str]]:
  """Predicted tags per sentence, each word taken from the position its row labels."""
  sentences = eval_set.meta["sentences"]
  tags: list[list[str | None]] = [[None] * len(words) for words, _ in sentences]
  owner, word = eval_set.meta["owner"], eval_set.meta["word"]
  for r in range(len(owner)):
    pos = np.flatnonzero(word[r] >= 0)
    for p in pos:
      tags[owner[r]][word[r, p]] = eval_set.meta["labels"][predicted[r, p]]
  missing = sum(t is None for s in tags for t in s)
  if missing:  # a bug, never a user error: every word has a labelled position
    raise RuntimeError(f"{missing} words of the {eval_set.name} set got no prediction")
  return tags  # type: ignore[return-value]
