"""A GLUE task's dev evaluation: every dev example predicted, scored with `bertjax.metrics.glue`.

Each evaluation writes WORKDIR/predictions/step_<N>/dev/<leaderboard name>.tsv (RTE.tsv,
MNLI-m.tsv, ...) and metrics.json; the final one also writes test/<leaderboard name>.tsv when a
test split exists: the files the GLUE server takes, and `python -m bertjax.tools.evaluate glue`
scores.
"""

from __future__ import annotations

import jax
import numpy as np

from bertjax.evaluators.base import Evaluator
from bertjax.metrics import glue
from bertjax.tasks import base
from bertjax.tasks.glue import task_of


class GlueEvaluator(Evaluator):
  name = "glue"
  own_task = True

  def run(self, params, step):
    c = self.context
    out_dir = c.output_dir(step)
    metrics: dict[str, float] = {}
    scores = []
    lines = []
    for s in c.data.eval_sets:
      spec, t = s.meta["spec"], glue.get_task(s.meta["spec"].task)
      logits = c.predict_rows(params, s, step)["logits"]
      preds = predictions_of(logits)
      m = glue.glue_metrics(t.name, preds, s.meta["labels"])
      scores.append(glue.glue_task_score(t.name, m))
      prefix = f"{spec.key}_" if spec.key else ""
      metrics.update({prefix + k: v for k, v in m.items()})
      metrics[prefix + "loss"] = dev_loss(logits, s.meta["labels"])
      metrics[prefix + "examples"] = len(preds)
      path = out_dir / "dev" / t.leaderboard_file
      if jax.process_index() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        glue.write_predictions_tsv(path, preds, t.name, indices=s.meta["idx"])
      lines.append(f"{t.name} dev " + " ".join(f"{k} {v:.4f}" for k, v in m.items())
                   + f" ({len(preds)} examples) -> {path}")
    metrics["score"] = float(np.mean(scores))
    if c.is_final(step):
      for s in c.data.test_sets:
        t = glue.get_task(s.meta["spec"].task)
        preds = predictions_of(c.predict_rows(params, s, step)["logits"])
        path = out_dir / "test" / t.leaderboard_file
        if jax.process_index() == 0:
          path.parent.mkdir(parents=True, exist_ok=True)
          glue.write_predictions_tsv(path, preds, t.name, indices=s.meta["idx"])
        lines.append(f"{t.name} test: {len(preds)} predictions -> {path}")
    base.write_json(out_dir / "metrics.json",
                    {"step": step, "task": task_of(self.config).name, **metrics})
    for line in lines:
      base.announce(f"step {step}: {line}")
    yield from metrics.items()


def predictions_of(logits: np.ndarray) -> np.ndarray:
  """Class ids, or the score of a one-output (regression) head."""
  return logits[:, 0].astype(np.float64) if logits.shape[-1] == 1 else logits.argmax(-1)


def dev_loss(logits: np.ndarray, labels: np.ndarray) -> float:
  """The dev set's mean loss: squared error (regression) or cross-entropy, in float64."""
  if logits.shape[-1] == 1:
    return float(np.mean(np.square(logits[:, 0].astype(np.float64) - labels)))
  z = logits.astype(np.float64)
  z = z - z.max(-1, keepdims=True)
  log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
  return float(-np.mean(log_probs[np.arange(len(labels)), labels]))
