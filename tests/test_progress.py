"""Progress lines with an ETA (time-based, driven here by fake clocks, never timed) and the end
table of a run."""

import io
import json
import re

import pytest

from bertjax.runtime import metric_writers, progress
from bertjax.runtime.progress import Progress
from bertjax.trainer import train

from test_task_glue import glue_config, glue_copy, spm_tokenizer
from test_train import tiny_config

LINE = re.compile(r"^(?P<what>.+) (?P<unit>step|batch) (?P<done>\d+)(?:/(?P<total>\d+) "
                  r"(?P<pct>\d+)%)?(?P<fields>.*?)"
                  r"(?: \| (?P<rate>[\d.e+]+) (?P<per>steps/s|batches/s|s/step|s/batch))?"
                  r"(?: \| ETA (?P<eta>\S+))?$")


def per_second(m) -> float:
  """The line's rate in units per second (slow passes print seconds per unit)."""
  return float(m["rate"]) if m["per"].endswith("/s") else 1 / float(m["rate"])


class FakeClock:
  """Time that moves only when the test says so."""

  def __init__(self, t=1000.0):
    self.t = t

  def __call__(self):
    return self.t


class TickingClock:
  """Time that moves `tick` seconds at every reading: a pass that takes long on any machine."""

  def __init__(self, tick):
    self.t, self.tick = 0.0, tick

  def __call__(self):
    self.t += self.tick
    return self.t


def seconds(eta: str) -> int:
  m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", eta)
  h, mi, s = (int(x or 0) for x in m.groups())
  return 3600 * h + 60 * mi + s


def test_a_long_pass_prints_a_line_every_interval_with_its_eta():
  """1000 steps of 0.25 s after a 30 s first step (compilation): a line at the first step saying
  so, then one per 10 s of work (every 40 steps) with the true rate and ETA, and a last at 100%."""
  clock, out = FakeClock(), io.StringIO()
  p = Progress("train", 1000, every_s=10.0, clock=clock, stream=out)
  clock.t += 30.0
  p.update(1, lambda: {"loss": 6.9})
  for step in range(2, 1001):
    clock.t += 0.25
    p.update(step, lambda: {"loss": 3.21})
  lines = out.getvalue().splitlines()
  assert lines == p.lines
  assert lines[0] == "train step 1/1000 0% loss 6.9 | 30s to the first step (compilation included)"
  parsed = [LINE.match(l).groupdict() for l in lines[1:]]
  done = [int(m["done"]) for m in parsed]
  assert done == list(range(41, 1001, 40)) + [1000]
  for m in parsed:
    assert m["what"] == "train" and m["total"] == "1000" and m["fields"] == " loss 3.21"
    assert int(m["pct"]) == int(m["done"]) * 100 // 1000
    assert m["per"] == "steps/s" and per_second(m) == pytest.approx(4.0)
    assert seconds(m["eta"]) == round((1000 - int(m["done"])) * 0.25)
  assert lines[1] == "train step 41/1000 4% loss 3.21 | 4 steps/s | ETA 4m00s"
  assert lines[-1].endswith("| ETA 0s") and "1000/1000 100%" in lines[-1]


def test_short_unknown_slow_and_silent_passes():
  clock, out = FakeClock(), io.StringIO()
  p = Progress("eval at step 5:", 3, unit="batch", every_s=10.0, clock=clock, stream=out)
  for i in range(3):  # 3 s in all: no line
    clock.t += 1.0
    p.update(i + 1)
  assert out.getvalue() == ""
  p = Progress("eval at step 5:", None, unit="batch", every_s=10.0, clock=clock, stream=out)
  for i in range(4):  # slow batches of unknown count: seconds per batch, no % or ETA
    clock.t += 25.0
    p.update(i + 1)
  assert p.lines[-1] == "eval at step 5: batch 4 | 25 s/batch"
  quiet = Progress("train", 10, every_s=0.0, clock=clock, stream=out, enabled=False)
  quiet.update(1)
  assert quiet.lines == []
  assert [progress.fmt_duration(s) for s in (0, 59.4, 61, 3599, 7500)] == [
      "0s", "59s", "1m01s", "59m59s", "2h05m"]


def test_training_and_pretraining_eval_print_lines_and_the_end_table_holds_the_true_values(
    tmp_path, capsys):
  clock = TickingClock(2.0)  # every reading 2 s later: a line every few steps and batches
  config = tiny_config(total_steps=12, log_every=4, eval_every=6, checkpoint_every=12,
                       progress_every_s=5.0, **{"data.eval_batches": 4})
  summary = train.train_and_evaluate(config, tmp_path, clock=clock)
  err = capsys.readouterr().err.splitlines()
  rows = metric_writers.read_metrics(tmp_path)
  train_lines = [l for l in err if l.startswith("train step ") and "ETA" in l]
  assert len(train_lines) >= 3, err
  for l in train_lines:
    m = LINE.match(l)
    assert m and m["total"] == "12", l
    # The loss of the last logged row (none before the first): no line waits for the device.
    # It is that row's mean over its steps, and the line says which.
    logged = [r for r in rows if r["split"] == "train" and r["step"] <= int(m["done"])]
    since = logged[-2]["step"] + 1 if len(logged) > 1 else 1
    assert m["fields"] == (f" loss {progress._number(logged[-1]['loss'])} (mean of steps "
                           f"{since}-{logged[-1]['step']})" if logged else ""), l
    assert seconds(m["eta"]) == pytest.approx((12 - int(m["done"])) / per_second(m), abs=1)
  assert any(m["fields"] for m in map(LINE.match, train_lines)), train_lines
  for step in (6, 12):
    evals = [l for l in err if l.startswith(f"eval at step {step}: batch ")]
    assert evals and all("/4 " in l for l in evals), err
    assert any("ETA" in l for l in evals)

  first = next(r for r in rows if r["split"] == "train")
  last = [r for r in rows if r["split"] == "train"][-1]
  last_eval = [r for r in rows if r["split"] == "eval"][-1]
  assert (summary["first_train_step"], summary["last_train_step"],
          summary["last_eval_step"]) == (4, 12, 12) == (first["step"], last["step"],
                                                          last_eval["step"])
  table = progress.end_table(summary, tmp_path / "summary.json").splitlines()
  assert table[0] == f"run finished at step 12: {tmp_path}"
  assert table[1].split() == ["first", "train", "(step", "4)", "last", "train", "(step", "12)",
                              "last", "eval", "(step", "12)"]
  cells = {l.split()[0]: l.split()[1:] for l in table[2:-2]}
  assert list(cells)[0] == "loss"
  for key in ("loss", "mlm_accuracy", "nsp_accuracy", "learning_rate"):
    want = [progress._number(r[key]) if key in r else "-" for r in (first, last, last_eval)]
    assert cells[key] == want, (key, table)
  assert "nonfinite" not in cells and "steps_per_s" not in cells
  assert table[-2] == f"checkpoint: {tmp_path / 'checkpoints' / '12'}"
  assert table[-1] == f"summary: {tmp_path / 'summary.json'} (every row: metrics.jsonl)"


@pytest.mark.slow
def test_fine_tuning_predictions_print_lines(tmp_path, data_dir, capsys):
  """RTE's 277 dev rows in batches of 16: the evaluation of a fine-tuning run shows its batches
  (18) with an ETA, and the run's train steps show theirs."""
  from bertjax.metrics import glue as glue_eval
  root = glue_copy(tmp_path, data_dir, "RTE")
  rows = glue_eval.read_glue_tsv(root / "RTE/train.tsv", "rte", "train")[:200]
  tok = spm_tokenizer(tmp_path, [r["sentence1"] for r in rows], 500)
  config = glue_config("task=rte,runlocal", data_dir=str(root), max_train_examples=32,
                       num_epochs=1.0, batch_size=8, eval_batch_size=16, progress_every_s=5.0,
                       **{"data.tokenizer": str(tok), "model.vocab_size": 500})
  train.train_and_evaluate(config, tmp_path / "run", clock=TickingClock(2.0))
  err = capsys.readouterr().err.splitlines()
  evals = [LINE.match(l) for l in err if l.startswith("eval rte dev at step 4: batch ")]
  assert len(evals) >= 3 and all(m and m["total"] == "18" for m in evals), err
  assert evals[-1]["done"] == "18" and evals[-1]["eta"] == "0s"
  assert any(l.startswith("train step ") and "/4 " in l for l in err), err


def test_the_eta_leaves_compilation_out():
  """Steps of 0.5 s; steps 2 and 30 also compile for 20 s (a new batch shape, the first
  evaluation): the rate and ETA of every line are those of the steps alone. On dd89774 the first
  lines' ETA counted the compilation (Progress took no `excluded`)."""
  clock, out, compiled = FakeClock(), io.StringIO(), [0.0]
  p = Progress("train", 100, every_s=10.0, clock=clock, stream=out, excluded=lambda: compiled[0])
  clock.t += 30.0
  p.update(1)
  for step in range(2, 101):
    clock.t += 0.5
    if step in (2, 30):
      clock.t += 20.0
      compiled[0] += 20.0
    p.update(step)
  parsed = [LINE.match(l) for l in p.lines[1:]]
  assert parsed and all(m["eta"] for m in parsed), p.lines
  for m in parsed:
    assert per_second(m) == pytest.approx(2.0), p.lines
    assert seconds(m["eta"]) == round((100 - int(m["done"])) * 0.5)


@pytest.mark.slow
def test_the_memory_line_is_printed_once(tmp_path, capsys):
  """With launch.py's logging set up, the train step's memory estimate shows once on stderr
  (on dd89774 twice: logged and printed)."""
  import logging
  import launch
  root = logging.getLogger()
  handlers, level = root.handlers[:], root.level
  try:
    launch.configure_logging()  # its handler writes to the captured stderr
    train.train_and_evaluate(tiny_config(total_steps=1, eval_every=0), tmp_path)
  finally:
    root.handlers[:], root.level = handlers, level
  err = capsys.readouterr().err
  assert err.count("the train step needs about") == 1, err


@pytest.mark.slow
def test_the_end_table_shows_the_best_evaluation_and_its_folder(tmp_path):
  """The end table names the best evaluation and where its parameters are (best/), and shows
  it as a column where it is not the last; without best_metric, the best by the main metric and
  how to keep it. On dd89774 only the last evaluation was shown (the best only in best.json)."""
  summary = train.train_and_evaluate(
      tiny_config(total_steps=4, eval_every=2, checkpoint_every=4, log_every=2,
                  best_metric="loss", best_mode="min"), tmp_path / "kept")
  kept = json.loads((tmp_path / "kept" / "best" / "best.json").read_text())
  assert (summary["best"], summary["best_eval_step"]) == (str(tmp_path / "kept" / "best"),
                                                          kept["step"])
  table = progress.end_table(summary).splitlines()
  assert (f"best: loss {progress._number(kept['value'])} at step {kept['step']}: "
          f"{tmp_path / 'kept' / 'best'}") in table

  earlier = {**summary, "best_eval_step": 2, "best_eval": {"loss": 1.5},
             "last_eval_step": 4, "last_eval": {"loss": 2.0}}
  table = progress.end_table(earlier).splitlines()
  assert table[1].split()[-8:] == ["last", "eval", "(step", "4)", "best", "eval", "(step", "2)"]
  assert next(l for l in table if l.startswith("loss")).split()[-2:] == ["2", "1.5"]

  summary = train.train_and_evaluate(
      tiny_config(total_steps=4, eval_every=2, checkpoint_every=4, log_every=2), tmp_path / "no")
  evals = [r for r in metric_writers.read_metrics(tmp_path / "no") if r["split"] == "eval"]
  best = min(evals, key=lambda r: r["loss"])
  assert summary["best"] is None and summary["best_eval_step"] == best["step"]
  assert (f"best: loss {progress._number(best['loss'])} at step {best['step']}: not kept "
          "(--config.best_metric=loss --config.best_mode=min keeps it in best/)"
          ) in progress.end_table(summary)


@pytest.mark.parametrize("metric, flags", [
    ("loss", "--config.best_metric=loss --config.best_mode=min"),
    ("score", "--config.best_metric=score"), ("f1", "--config.best_metric=f1"),
])
def test_the_hint_to_keep_the_best_keeps_that_best(metric, flags):
  """ea9bcfe's hint for a loss was `--config.best_metric=loss keeps it in best/`, but with
  best_mode's default, max, that kept the highest loss (quickstart runlocal: step 10's 8.817,
  not step 20's 8.327, shown as the best); a loss needs best_mode=min too."""
  summary = {"status": "finished", "step": 20, "best_metric": metric, "best": None,
             "best_eval_step": 20, "best_eval": {metric: 0.5}, "last_eval_step": 20,
             "last_eval": {metric: 0.5}}
  assert f"best: {metric} 0.5 at step 20: not kept ({flags} keeps it in best/)" in (
      progress.end_table(summary).splitlines())
