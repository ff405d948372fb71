"""Sweep reports: the table, spreads over seeds, the GLUE average, the best points, the plots,
and a real sweep in which one point crashes."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from matplotlib import image as mpimg

from bertjax import sweep
from bertjax.core.errors import UserError
from bertjax.tools import report

REPO = pathlib.Path(__file__).resolve().parent.parent


def write_point(sweep_dir: pathlib.Path, name: str, config: dict, train_loss: list[float],
                evals: list[dict], finished: bool = True) -> None:
  """A point folder as the trainer leaves it: metrics.jsonl, config.json, summary.json."""
  d = sweep_dir / name
  d.mkdir(parents=True)
  rows = [{"step": i + 1, "split": "train", "loss": l, "tokens_per_s": 1000.0 + i}
          for i, l in enumerate(train_loss)]
  rows += [{"step": (i + 1) * 10, "split": "eval", **e} for i, e in enumerate(evals)]
  rows.sort(key=lambda r: (r["step"], r["split"] == "eval"))
  (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (d / "config.json").write_text(json.dumps(config))
  if finished:
    (d / "summary.json").write_text(json.dumps({"status": "finished",
                                                "step": config["total_steps"]}))


def write_sweep_json(sweep_dir: pathlib.Path, entries: list[dict]) -> None:
  (sweep_dir / "sweep.json").write_text(json.dumps({"points": entries}))


def entry(name, overrides, total_steps, status="finished", **extra):
  return {"name": name, "overrides": overrides, "total_steps": total_steps, "status": status,
          "wall_s": 12.5, **extra}


@pytest.fixture
def pretraining_sweep(tmp_path):
  """2 learning rates x 3 seeds with two evaluations each, and a point that failed midway."""
  rng = np.random.default_rng(0)
  entries, data = [], {}
  for lr in (1e-3, 3e-3):
    for seed in (0, 1, 2):
      overrides = {"learning_rate": lr, "seed": seed}
      name = sweep.point_name(overrides)
      evals = [{"loss": float(rng.uniform(5, 9)), "mlm_accuracy": float(rng.uniform(0, 0.5)),
                "examples": 64} for _ in range(2)]
      loss = [float(x) for x in rng.uniform(5, 10, size=5)]
      write_point(tmp_path, name, {"objective": "mlm", "learning_rate": lr, "seed": seed,
                                   "total_steps": 20, "batch_size": 8,
                                   "data": {"eval_batches": 1}}, loss, evals)
      entries.append(entry(name, overrides, 20))
      data[name] = {"overrides": overrides, "evals": evals, "loss": loss}
  bad = sweep.point_name({"learning_rate": 1.0, "seed": 0})
  write_point(tmp_path, bad, {"objective": "mlm", "learning_rate": 1.0, "seed": 0,
                              "total_steps": 20}, [9.0, float("nan")], [], finished=False)
  (tmp_path / bad / "log.txt").write_text("# bertjax.sweep 2026: old launch\nold\n"
                                          "# bertjax.sweep 2026: python launch.py\n"
                                          "Traceback (most recent call last):\n"
                                          "FloatingPointError: loss is nan at step 2\n\n")
  entries.append(entry(bad, {"learning_rate": 1.0, "seed": 0}, 20, status="failed"))
  write_sweep_json(tmp_path, entries)
  return tmp_path, data, bad


def test_table_spread_best_and_plots(pretraining_sweep):
  sweep_dir, data, bad = pretraining_sweep
  result = report.write_report(sweep_dir)
  # Pretraining: the eval loss, and the report says it comes from one batch of 8 rows.
  assert result["metric"] == "loss"
  assert result["scope"] == "over 1 batch of 8 held-out rows: data.eval_batches=1"
  assert ("Main dev metric: `loss`, over 1 batch of 8 held-out rows: data.eval_batches=1."
          in (sweep_dir / "report.md").read_text())
  table = (sweep_dir / "report.md").read_text()
  for name in [*data, bad]:
    assert sum(l.startswith(f"| {name} |") for l in table.splitlines()) == 1, name
  for name, d in data.items():
    row = next(l for l in table.splitlines() if l.startswith(f"| {name} |"))
    final, best = d["evals"][-1], d["evals"]
    acc = f"{final['mlm_accuracy']:.4g} ({max(e['mlm_accuracy'] for e in best):.4g})"
    loss = f"{final['loss']:.4g} ({min(e['loss'] for e in best):.4g})"
    assert acc in row and loss in row and "| finished |" in row, row
    assert "examples" not in table  # a counter, not a metric
  bad_row = next(l for l in table.splitlines() if l.startswith(f"| {bad} |"))
  assert "failed: FloatingPointError: loss is nan at step 2" in bad_row

  # Median and spread over seeds, per learning rate.
  groups = {dict(g["setting"])["learning_rate"]: g for g in result["seed_groups"]}
  assert set(groups) == {"0.001", "0.003"}
  for lr, g in groups.items():
    finals = [d["evals"][-1]["mlm_accuracy"] for d in data.values()
              if repr(d["overrides"]["learning_rate"]) == lr]
    s = g["metrics"]["mlm_accuracy"]
    assert s["n"] == 3 and s["median"] == pytest.approx(np.median(finals))
    assert (s["min"], s["max"]) == (min(finals), max(finals))
    assert s["std"] == pytest.approx(np.std(finals))
    assert f"{np.median(finals):.4g} [{min(finals):.4g}, {max(finals):.4g}]" in table

  # The best point per metric: highest accuracy, lowest loss.
  best = {b["metric"]: b for b in result["best"]}
  top = max(data, key=lambda n: data[n]["evals"][-1]["mlm_accuracy"])
  low = min(data, key=lambda n: data[n]["evals"][-1]["loss"])
  assert best["mlm_accuracy"]["point"] == top and best["loss"]["point"] == low

  # The plots: valid images, and the data they were drawn from.
  for png in ("train_loss.png", "dev_vs_lr.png"):
    pixels = mpimg.imread(sweep_dir / png)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert float(pixels[..., :3].std()) > 0.01  # something is drawn
  curves = json.loads((sweep_dir / "train_loss.json").read_text())["curves"]
  assert len(curves) == 7  # every point with training metrics, the failed one included
  by_name = {c["point"]: c for c in curves}
  for name, d in data.items():
    assert by_name[name]["steps"] == [1, 2, 3, 4, 5]
    assert by_name[name]["loss"] == pytest.approx(d["loss"])
  dev = json.loads((sweep_dir / "dev_vs_lr.json").read_text())
  assert dev["metric"] == "loss" and len(dev["series"]) == 1
  series = dev["series"][0]
  assert series["learning_rate"] == [1e-3, 3e-3]
  for i, lr in enumerate(series["learning_rate"]):
    finals = [d["evals"][-1]["loss"] for d in data.values()
              if d["overrides"]["learning_rate"] == lr]
    assert series["median"][i] == pytest.approx(np.median(finals))
    assert (series["min"][i], series["max"][i], series["n"][i]) == (
        pytest.approx(np.min(finals)), pytest.approx(np.max(finals)), 3)
  assert len(series["points"]) == 6
  # What the plot aggregates is written on it.
  assert dev["legend"] == ["all points: median of 3 seeds"]
  assert dev["title"] == ("dev loss at the last evaluation, over 1 batch of 8 held-out rows: "
                          "data.eval_batches=1\nmedian over seeds; band: min–max over seeds; "
                          "dots: single seeds")
  assert dev["ylabel"] == "dev loss (lower is better)"
  assert dev["xticklabels"] == ["1e-3", "3e-3"]

  # Training loss: per learning rate the median of the seeds at every step, min-max band.
  loss_plot = json.loads((sweep_dir / "train_loss.json").read_text())
  assert loss_plot["title"] == ("training loss: median over seeds; band: min–max over seeds; "
                                "thin lines: single seeds")
  by_label = {s["label"]: s for s in loss_plot["series"]}
  assert sorted(by_label) == ["learning_rate=0.001: median of 3 seeds",
                              "learning_rate=0.003: median of 3 seeds",
                              "learning_rate=1.0: median of 1 seed"]
  assert loss_plot["legend"] == [s["label"] for s in loss_plot["series"]]
  for lr in (1e-3, 3e-3):
    curves = np.array([d["loss"] for d in data.values() if d["overrides"]["learning_rate"] == lr])
    s = by_label[f"learning_rate={lr!r}: median of 3 seeds"]
    assert s["steps"] == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(s["median"], np.median(curves, axis=0))
    np.testing.assert_allclose(s["min"], curves.min(axis=0))
    np.testing.assert_allclose(s["max"], curves.max(axis=0))


def test_metric_choice_and_bad_input(pretraining_sweep, tmp_path_factory):
  sweep_dir, _, _ = pretraining_sweep
  assert report.write_report(sweep_dir, metric="loss")["metric"] == "loss"
  assert json.loads((sweep_dir / "dev_vs_lr.json").read_text())["metric"] == "loss"
  with pytest.raises(UserError, match="'acc' is not a dev metric"):
    report.write_report(sweep_dir, metric="acc")
  with pytest.raises(UserError, match="not found"):
    report.write_report(sweep_dir / "nope")
  with pytest.raises(UserError, match="no sweep.json, no run folders and no run"):
    report.write_report(tmp_path_factory.mktemp("empty"))


def test_folders_without_sweep_json(tmp_path):
  for lr in (1e-4, 2e-4):
    write_point(tmp_path, f"learning_rate={lr!r}", {"learning_rate": lr, "total_steps": 3},
                [3.0, 2.0, 1.0], [{"accuracy": lr * 1000}])
  points = report.load_points(tmp_path)
  assert sorted(p.overrides["learning_rate"] for p in points) == [1e-4, 2e-4]
  assert all(p.status == "finished" and p.steps == 3 for p in points)


def test_one_run_and_runs_of_two_tasks(tmp_path, capsys):
  """`report RUN` draws that run's curves (training loss, dev metric over the steps); a folder of
  an RTE and an SST-2 run (names that are not key=value) plots each task apart, never as seeds of
  one setting. On dd89774 the single run was refused ("holds no sweep.json and no run folders")
  and the two tasks were merged into one curve labelled "median of 2 seeds"."""
  glue_config = lambda task: {"objective": "glue", "task": task, "learning_rate": 2e-5,
                              "total_steps": 20, "seed": 0}
  write_point(tmp_path / "runs", "rte", glue_config("rte"), [0.7, 0.69, 0.68],
              [{"score": 0.5, "accuracy": 0.5}, {"score": 0.6, "accuracy": 0.6}])
  write_point(tmp_path / "runs", "sst2", glue_config("sst2"), [0.6, 0.5, 0.4],
              [{"score": 0.8, "accuracy": 0.8}, {"score": 0.9, "accuracy": 0.9}])

  run = tmp_path / "runs" / "rte"
  report.main([str(run)])
  assert f"wrote {run / 'report.md'}, train_loss.png, dev_curve.png" in capsys.readouterr().out
  loss = json.loads((run / "train_loss.json").read_text())
  assert loss["legend"] == ["rte"] and loss["title"] == "training loss: rte"
  assert loss["series"][0]["steps"] == [1, 2, 3]
  assert loss["series"][0]["median"] == [0.7, 0.69, 0.68]
  dev = json.loads((run / "dev_curve.json").read_text())
  assert dev["series"][0]["steps"] == [10, 20] and dev["series"][0]["median"] == [0.5, 0.6]
  assert dev["title"].startswith("dev score, over the whole dev set")
  assert (run / "report.md").read_text().startswith(f"# Run report: {run}")
  assert not (run / "dev_vs_lr.png").exists()  # one learning rate: nothing to draw against

  result = report.write_report(tmp_path / "runs")
  assert [p.overrides for p in result["points"]] == [{"task": "rte"}, {"task": "sst2"}]
  assert result["seed_groups"] == []
  for name in ("train_loss.json", "dev_curve.json"):
    drawn = json.loads((tmp_path / "runs" / name).read_text())
    assert sorted(drawn["legend"]) == ["task=rte: median of 1 seed",
                                       "task=sst2: median of 1 seed"], name
    assert not any("2 seeds" in label for label in drawn["legend"])
  assert {s["label"]: s["median"] for s in json.loads(
      (tmp_path / "runs" / "train_loss.json").read_text())["series"]}["task=sst2: median of 1 seed"] \
      == [0.6, 0.5, 0.4]


GLUE_METRICS = {"rte": ("accuracy",), "mrpc": ("f1", "accuracy"),
                "mnli": ("matched_accuracy", "mismatched_accuracy"), "wnli": ("accuracy",)}


def test_glue_average_as_papers_report_it(tmp_path):
  """Per task, the setting with the best median over seeds; WNLI out; MNLI = mean of m/mm."""
  rng = np.random.default_rng(1)
  entries = []
  values = {}  # (task, lr) -> list over seeds of {metric: value}
  for task, metrics in GLUE_METRICS.items():
    for lr in (2e-5, 3e-5):
      for seed in (1, 2, 3):
        if task == "rte":
          # lr 2e-5 has the higher mean (one lucky seed) but the lower median.
          acc = {2e-5: [0.60, 0.61, 0.99], 3e-5: [0.65, 0.66, 0.67]}[lr][seed - 1]
          row = {"accuracy": acc}
        elif task == "wnli":
          row = {"accuracy": 0.99}
        else:
          row = {m: float(rng.uniform(0.5, 0.9)) for m in metrics}
        row["score"] = float(np.mean([row[m] for m in metrics]))
        values.setdefault((task, lr), []).append(row)
        overrides = {"task": task, "learning_rate": lr, "seed": seed}
        name = sweep.point_name(overrides)
        write_point(tmp_path, name, {"objective": "glue", "task": task, "learning_rate": lr,
                                     "seed": seed, "total_steps": 30},
                    [1.0, 0.5], [{**row, "loss": 0.3}])
        entries.append(entry(name, overrides, 0))  # GLUE: total_steps from the epochs
  write_sweep_json(tmp_path, entries)
  result = report.write_report(tmp_path)

  chosen_scores = {}
  for task, metrics in GLUE_METRICS.items():
    per_lr = {lr: np.mean([np.median([r[m] for r in values[(task, lr)]]) for m in metrics])
              for lr in (2e-5, 3e-5)}
    lr = max(per_lr, key=per_lr.get)
    chosen_scores[task] = per_lr[lr]
    assert dict(result["glue"]["tasks"][task]["setting"])["learning_rate"] == repr(lr), task
  assert dict(result["glue"]["tasks"]["rte"]["setting"])["learning_rate"] == "3e-05"
  assert chosen_scores["rte"] == pytest.approx(0.66)
  expected = np.mean([chosen_scores[t] for t in ("rte", "mrpc", "mnli")])
  assert result["glue"]["average"] == pytest.approx(expected)
  assert sorted(result["glue"]["counted"]) == ["mnli", "mrpc", "rte"]
  table = (tmp_path / "report.md").read_text()
  assert f"GLUE average: {expected:.4g}" in table
  best = {(b["task"], b["metric"]): b["point"] for b in result["best"]}
  assert best[("rte", "accuracy")] == sweep.point_name(
      {"task": "rte", "learning_rate": 2e-5, "seed": 3})  # the single best run
  dev = json.loads((tmp_path / "dev_vs_lr.json").read_text())
  assert dev["metric"] == "score" and len(dev["series"]) == len(GLUE_METRICS)
  assert result["scope"] == "over the whole dev set"
  assert "at the last evaluation, over the whole dev set\n" in dev["title"]
  assert "median over seeds; band: min–max over seeds" in dev["title"]
  assert dev["xticklabels"] == ["2e-5", "3e-5"]
  assert dev["ylabel"] == "dev score (higher is better)"
  rte = next(s for s in dev["series"] if s["label"] == "task=rte: median of 3 seeds")
  for i, lr in enumerate((2e-5, 3e-5)):
    scores = [r["score"] for r in values[("rte", lr)]]
    assert (rte["median"][i], rte["min"][i], rte["max"][i]) == pytest.approx(
        (np.median(scores), np.min(scores), np.max(scores)))
  assert "Main dev metric: `score`, over the whole dev set." in table


@pytest.mark.parametrize("config, metric", [
    ({"objective": "glue", "task": "rte"}, "score"),
    ({"objective": "distill_glue", "task": "rte"}, "score"),
    ({"objective": "squad", "version": "2.0"}, "f1"),
    ({"objective": "ner", "task": "ner"}, "f1"),
    ({"objective": "ner", "task": "pos"}, "accuracy"),
    ({"objective": "mlm_nsp"}, "loss"),
    ({"objective": "rtd"}, "loss"),
])
def test_the_default_metric_is_the_objectives_main_metric(tmp_path, config, metric):
  """Each point logs loss, accuracy, f1 and score; the report plots its objective's own."""
  for seed in (1, 2):
    write_point(tmp_path, f"learning_rate=0.0001,seed={seed}",
                {**config, "learning_rate": 1e-4, "seed": seed, "total_steps": 3}, [1.0],
                [{"loss": 0.5, "accuracy": 0.7, "f1": 0.6, "score": 0.65}])
  assert report.write_report(tmp_path)["metric"] == metric
  dev = json.loads((tmp_path / "dev_vs_lr.json").read_text())
  assert dev["metric"] == metric and dev["xticklabels"] == ["1e-4"]


@pytest.mark.slow
def test_crashing_point_is_reported_and_the_others_run(tmp_path):
  """A real sweep on the WikiText-2 sample: the first point crashes, the second still runs."""
  path = tmp_path / "crash.py"
  path.write_text("def get_sweep():\n  return " + repr({
      "config": "configs/quickstart.py:runlocal",
      "fixed": {"total_steps": 6, "log_every": 2, "eval_every": 6, "checkpoint_every": 6,
                "tensorboard": False, "async_checkpointing": False},
      "points": [{"objective": "nope"}, {"objective": "mlm_nsp"}]}) + "\n")
  workdir = tmp_path / "w"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "launch.py", "--sweep", str(path), "--workdir", str(workdir)],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]  # a point failed
  points = {p["name"]: p for p in json.loads((workdir / "sweep.json").read_text())["points"]}
  assert points["objective=nope"]["status"] == "failed"
  assert points["objective=nope"]["last_line"].startswith("error: unknown objective 'nope'")
  assert points["objective=mlm_nsp"]["status"] == "finished"
  good = workdir / "objective=mlm_nsp"
  assert json.loads((good / "config.json").read_text())["data"]["synthetic"] is False
  assert "training a sentencepiece tokenizer" in (good / "log.txt").read_text()  # real data

  r = subprocess.run([sys.executable, "-m", "bertjax.tools.report", str(workdir)], cwd=REPO,
                     env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  table = (workdir / "report.md").read_text()
  row = next(l for l in table.splitlines() if l.startswith("| objective=nope |"))
  assert "failed: error: unknown objective 'nope'" in row
  row = next(l for l in table.splitlines() if l.startswith("| objective=mlm_nsp |"))
  assert "| finished | 6 |" in row
  curves = json.loads((workdir / "train_loss.json").read_text())["curves"]
  assert [c["point"] for c in curves] == ["objective=mlm_nsp"]
  assert curves[0]["steps"] == [2, 4, 6]
  assert mpimg.imread(workdir / "train_loss.png").shape[0] > 100


def test_a_file_given_for_the_folder_is_named_a_file(tmp_path):
  """ea9bcfe said `sweep folder .../metrics.jsonl not found` of a file that is there."""
  file = tmp_path / "metrics.jsonl"
  file.write_text('{"step": 1, "split": "train", "loss": 9.0}\n')
  with pytest.raises(UserError) as e:
    report.write_report(file)
  assert str(e.value) == (f"{file} is a file, not a folder; pass the --workdir of a sweep or of "
                          "a run, not a file in it")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
