"""Every command reads and writes gs:// paths where it takes local ones (bertjax/core/paths.py).

Each test runs a command on a local folder and on the same folder copied onto the fake bucket of
tests/fake_gcs.py (`gs://bucket/...` is the folder `fake_gcs / "bucket/..."`; it refuses
appends as an object store does), in this process, and compares the outputs. A missing gs://
input is one line (a UserError).
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import shutil

import jax
import numpy as np
import pytest

import bertjax
from bertjax import sweep
from bertjax.config import config_lib
from bertjax.convert import __main__ as convert_cli
from bertjax.core.errors import UserError
from bertjax.data import tokenizers
from bertjax.metrics import ner, squad
from bertjax.prune import __main__ as prune_cli
from bertjax.runtime import checkpoints, metric_writers
from bertjax.tools import embed, evaluate, multiseed, report
from bertjax.trainer import train
from conftest import DATA_DIR
from helpers import TINY, load_config


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
  """A tiny SST-2 run (4 heads x 2 layers, 4 steps on 64 sentences; dev cut to 48 rows), its
  GLUE folder beside it (glue/SST-2/dev.tsv)."""
  if not DATA_DIR.is_dir():
    pytest.skip(f"shared data not found at {DATA_DIR}; set BERTJAX_DATA to its folder")
  tmp = tmp_path_factory.mktemp("remote")
  glue_root = tmp / "glue" / "SST-2"
  glue_root.mkdir(parents=True)
  train_lines = (DATA_DIR / "glue/SST-2/train.tsv").read_text().splitlines()
  (glue_root / "train.tsv").write_text("\n".join(train_lines[:200]) + "\n")
  dev = (DATA_DIR / "glue/SST-2/dev.tsv").read_text().splitlines()
  (glue_root / "dev.tsv").write_text("\n".join(dev[:49]) + "\n")
  tok = tmp / "tok"
  tokenizers.train_sentencepiece([l.split("\t")[0] for l in train_lines[1:2001]], tok,
                                 vocab_size=400, num_threads=1)
  config = load_config("configs/glue.py:task=sst2,runlocal", **{
      **TINY, "model.num_attention_heads": 4, "model.vocab_size": 400, "data.tokenizer": str(tok),
      "data_dir": str(tmp / "glue"), "max_train_examples": 64, "num_epochs": 1.0,
      "batch_size": 16, "max_seq_length": 32})
  train.train_and_evaluate(config, tmp / "run")
  return tmp / "run"


def on_bucket(fake_gcs, local: pathlib.Path, name: str) -> str:
  """Copies the folder `local` to gs://bucket/<name>; returns that URL."""
  shutil.copytree(local, fake_gcs / "bucket" / name)
  return f"gs://bucket/{name}"


def files_of(folder: pathlib.Path) -> dict[str, bytes]:
  return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
          if p.is_file()}


# ----------------------------------------------------------------------------- convert, load


@pytest.mark.slow
def test_to_hf_from_and_to_gs_equals_local(finetuned, fake_gcs, tmp_path, capsys):
  remote = on_bucket(fake_gcs, finetuned, "runs/sst2")
  convert_cli.main(["to-hf", "--workdir", str(finetuned), "--output", str(tmp_path / "hf")])
  convert_cli.main(["to-hf", "--workdir", remote, "--output", "gs://bucket/hf"])
  out = capsys.readouterr().out
  assert f"exported the fine-tuning folder at step 4 {remote}" in out
  assert "wrote BertForSequenceClassification to gs://bucket/hf" in out
  local_files = files_of(tmp_path / "hf")
  assert {"config.json", "model.safetensors", "spiece.model"} <= set(local_files)
  assert files_of(fake_gcs / "bucket/hf") == local_files
  # to a local folder from the bucket: the same files again
  convert_cli.main(["to-hf", "--workdir", remote, "--output", str(tmp_path / "hf2")])
  assert files_of(tmp_path / "hf2") == local_files
  with pytest.raises(UserError, match="--output gs://bucket/hf is not empty"):
    convert_cli.main(["to-hf", "--workdir", remote, "--output", "gs://bucket/hf"])
  # and back: from-hf of the bucket's folder into the bucket equals from-hf of the local one
  convert_cli.main(["from-hf", "--model-dir", str(tmp_path / "hf"), "--workdir",
                    str(tmp_path / "back")])
  convert_cli.main(["from-hf", "--model-dir", "gs://bucket/hf", "--workdir", "gs://bucket/back"])
  local, far = bertjax.load(tmp_path / "back"), bertjax.load("gs://bucket/back")
  assert far.heads == local.heads and far.config == local.config
  for a, b in zip(jax.tree.leaves(local.head_params), jax.tree.leaves(far.head_params)):
    np.testing.assert_array_equal(a, b)
  meta = json.loads((fake_gcs / "bucket/back/model.json").read_text())
  assert meta["source"] == "gs://bucket/hf"
  assert (files_of(fake_gcs / "bucket/back/tokenizer")
          == files_of(tmp_path / "back/tokenizer") != {})


@pytest.mark.slow
def test_load_from_gs_equals_local(finetuned, fake_gcs):
  remote = on_bucket(fake_gcs, finetuned, "runs/sst2")
  local, far = bertjax.load(finetuned), bertjax.load(remote)
  assert far.source.step == local.source.step == 4 and str(far.source.path) == remote
  assert far.task == local.task and far.task.kind == "sequence"
  for a, b in zip(jax.tree.leaves(local.head_params), jax.tree.leaves(far.head_params)):
    np.testing.assert_array_equal(a, b)
  ids = np.random.RandomState(0).randint(5, 400, (2, 12))
  mask, types = np.ones_like(ids), np.zeros_like(ids)
  np.testing.assert_array_equal(local.logits(ids, mask, types), far.logits(ids, mask, types))
  # the tokenizer is read from a local copy of the bucket's
  assert (far.source.tokenizer / "spm.model").read_bytes() == (
      finetuned / "tokenizer/spm.model").read_bytes()
  best = bertjax.load(remote + "/best")
  assert best.source.kind == "best"


def test_missing_gs_paths_are_one_line(fake_gcs):
  (fake_gcs / "bucket").mkdir()
  with pytest.raises(UserError, match="gs://bucket/nothing does not exist"):
    bertjax.load("gs://bucket/nothing")
  with pytest.raises(UserError, match="gs://bucket/nothing does not exist"):
    convert_cli.main(["to-hf", "--workdir", "gs://bucket/nothing", "--output", "gs://bucket/o"])
  with pytest.raises(UserError, match="gs://bucket/nothing does not exist"):
    convert_cli.main(["from-hf", "--model-dir", "gs://bucket/nothing", "--workdir", "gs://b/o"])


# ----------------------------------------------------------------------------- embed


@pytest.mark.slow
def test_embed_from_and_to_gs_equals_local(finetuned, fake_gcs, tmp_path):
  remote = on_bucket(fake_gcs, finetuned, "runs/sst2")
  glue_dir = on_bucket(fake_gcs, finetuned.parent / "glue", "glue")
  text = tmp_path / "in.txt"
  text.write_text("a fine film\nnot good at all\n\nthe end\n")
  (fake_gcs / "bucket/in.txt").write_bytes(text.read_bytes())
  for source, remote_source in ((["--input", str(text)], ["--input", "gs://bucket/in.txt"]),
                                (["--glue", "sst2", "--data_dir", str(finetuned.parent / "glue")],
                                 ["--glue", "sst2", "--data_dir", glue_dir])):
    common = ["--tokens", "--pooling", "mean", "--layers=-2,-1"]
    embed.main(["--workdir", str(finetuned), *source, "--output", str(tmp_path / "x.npz"),
                "--overwrite", *common])
    embed.main(["--workdir", remote, *remote_source, "--output", "gs://bucket/out/x.npz",
                "--overwrite", *common])
    local, far = np.load(tmp_path / "x.npz"), np.load(fake_gcs / "bucket/out/x.npz")
    assert sorted(local) == sorted(far) == ["attention_mask", "input_ids", "pooled", "tokens"]
    for name in local:
      np.testing.assert_array_equal(local[name], far[name])
  assert local["pooled"].shape == (48, 64)  # the run's 48 dev rows
  with pytest.raises(UserError, match="--output gs://bucket/out/x.npz exists; pass --overwrite"):
    embed.main(["--workdir", remote, "--input", "gs://bucket/in.txt", "--output",
                "gs://bucket/out/x.npz"])
  with pytest.raises(UserError, match="cannot read input file gs://bucket/none.txt"):
    embed.main(["--workdir", remote, "--input", "gs://bucket/none.txt", "--output",
                "gs://bucket/out/y.npz"])
  with pytest.raises(UserError, match="gs://bucket/none does not exist"):
    embed.main(["--workdir", "gs://bucket/none", "--input", "gs://bucket/in.txt", "--output",
                "gs://bucket/out/y.npz"])


# ----------------------------------------------------------------------------- evaluate


def _evaluated(argv, capsys) -> tuple[dict, str]:
  result = evaluate.main(argv)
  return result, capsys.readouterr().out


@pytest.mark.slow
def test_evaluate_gs_predictions_and_gold_equals_local(finetuned, fake_gcs, tmp_path, capsys):
  """GLUE: the run's own predictions against its dev file (the task from the gold file's path);
  SQuAD v2.0 with null odds and CoNLL NER: hand-made predictions of the shared dev subsets."""
  glue_gold = finetuned.parent / "glue/SST-2/dev.tsv"
  glue_pred = tmp_path / "preds.tsv"  # not a leaderboard name: the task is read off the gold path
  shutil.copyfile(finetuned / "predictions/step_4/dev/SST-2.tsv", glue_pred)
  squad_gold = DATA_DIR / "squad/v2.0_dev_subset.json"
  _, examples = squad.read_squad(squad_gold)
  (tmp_path / "pred.json").write_text(json.dumps({e["id"]: e["answers"][0]["text"]
                                                  if e["answers"] else "" for e in examples}))
  (tmp_path / "odds.json").write_text(json.dumps({e["id"]: 0.5 * i for i, e in
                                                  enumerate(examples)}))
  conll = ner.read_conll(DATA_DIR / "conll2003/valid.txt")[:40]
  (tmp_path / "gold.txt").write_text("\n\n".join(
      "\n".join(f"{w} NN O {t}" for w, t in zip(s.tokens, s.tags)) for s in conll) + "\n")
  ner.write_ner_predictions(tmp_path / "ner.txt", [s.tokens for s in conll],
                            [["O"] + s.tags[1:] for s in conll])
  files = {"glue/SST-2/dev.tsv": glue_gold, "run/preds.tsv": glue_pred,
           "squad.json": squad_gold, "pred.json": tmp_path / "pred.json",
           "odds.json": tmp_path / "odds.json", "gold.txt": tmp_path / "gold.txt",
           "ner.txt": tmp_path / "ner.txt"}
  for name, path in files.items():
    (fake_gcs / "bucket/e" / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, fake_gcs / "bucket/e" / name)
  for benchmark, *names in (("glue", "--data", "glue/SST-2/dev.tsv", "--predictions",
                             "run/preds.tsv"),
                            ("squad", "--data", "squad.json", "--predictions", "pred.json",
                             "--null_odds", "odds.json"),
                            ("ner", "--data", "gold.txt", "--predictions", "ner.txt")):
    local = [str(files[n]) if n in files else n for n in names]
    remote = [f"gs://bucket/e/{n}" if n in files else n for n in names]
    want, want_out = _evaluated([benchmark, *local], capsys)
    got, got_out = _evaluated([benchmark, *remote], capsys)
    assert got == want and got_out == want_out, benchmark
  assert want["num_sentences"] == 40 and 0 < want["f1"] < 1
  with pytest.raises(UserError, match="predictions file not found: gs://bucket/e/none.tsv"):
    evaluate.main(["glue", "--data", "gs://bucket/e/glue/SST-2/dev.tsv", "--predictions",
                   "gs://bucket/e/none.tsv", "--task", "sst2"])
  with pytest.raises(UserError, match="SQuAD file not found: gs://bucket/e/none.json"):
    evaluate.main(["squad", "--data", "gs://bucket/e/none.json", "--predictions",
                   "gs://bucket/e/pred.json"])


# ----------------------------------------------------------------------------- prune


@pytest.mark.slow
def test_prune_gs_workdir_to_gs_output_equals_local(finetuned, fake_gcs, tmp_path):
  remote = on_bucket(fake_gcs, finetuned, "runs/sst2")
  args = ["--target-heads", "0.5", "--finetune-steps", "1"]
  want = prune_cli.main(["--workdir", str(finetuned), "--output", str(tmp_path / "p"), *args])
  got = prune_cli.main(["--workdir", remote, "--output", "gs://bucket/pruned", *args])
  assert got == want and [r["heads"] for r in got] == [8, 4]
  bucket = fake_gcs / "bucket/pruned"
  assert (bucket / "pruning.csv").read_text() == (tmp_path / "p/pruning.csv").read_text()
  assert (bucket / "pruning.png").stat().st_size > 0
  assert json.loads((bucket / "summary.json").read_text())["rows"] == json.loads(
      (tmp_path / "p/summary.json").read_text())["rows"]
  for sub in ("step_1/pruned", "step_1/finetuned"):
    for a, b in zip(jax.tree.leaves(checkpoints.restore_params(tmp_path / "p" / sub)),
                    jax.tree.leaves(checkpoints.restore_params(f"gs://bucket/pruned/{sub}"))):
      np.testing.assert_array_equal(a, b)
  assert (bucket / "step_1/pruned/tokenizer/spm.model").is_file()
  with pytest.raises(UserError, match="--output gs://bucket/pruned exists and is not empty"):
    prune_cli.main(["--workdir", remote, "--output", "gs://bucket/pruned", *args])
  with pytest.raises(UserError, match="--workdir gs://bucket/none does not exist"):
    prune_cli.main(["--workdir", "gs://bucket/none", "--output", "gs://bucket/p2", *args])
  assert not (fake_gcs / "bucket/p2").exists()


# ----------------------------------------------------------------------------- sweeps, report

# A tiny model on random batches (tests/test_sweep.py's), 2 steps a point.
FAST = ["--config.data.synthetic=True", "--config.model.vocab_size=200",
        "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
        "--config.model.num_attention_heads=2", "--config.max_seq_length=16",
        "--config.max_predictions_per_seq=4", "--config.async_checkpointing=False",
        "--config.total_steps=2", "--config.log_every=1", "--config.eval_every=2",
        "--config.checkpoint_every=2"]
SWEEP = {"config": "configs/quickstart.py:runlocal",
         "product": {"learning_rate": [1e-3], "seed": [0, 1]}}


class InProcess:
  """subprocess.Popen for a sweep point (`python launch.py --config C --workdir W --config.k=v`):
  the run in this process, where the fake bucket is, its output written to the log file."""

  def __init__(self, argv, stdout, **kwargs):
    del kwargs
    assert argv[1] == "launch.py", argv
    spec, workdir = argv[argv.index("--config") + 1], argv[argv.index("--workdir") + 1]
    config = load_config(spec)
    config_lib.apply_overrides(config, [a for a in argv if a.startswith("--config.")])
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stdout):
      train.train_and_evaluate(config, workdir)
    stdout.flush()
    self.returncode = 0

  def wait(self, timeout=None):  # the sweep waits with a timeout to show a point's progress
    del timeout
    return self.returncode

  poll = wait


def run_sweep(spec: pathlib.Path, workdir) -> dict:
  with pytest.MonkeyPatch.context() as m:
    m.setattr(sweep.runner.subprocess, "Popen", InProcess)
    return sweep.run_sweep(str(spec), workdir, overrides=FAST)


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
  """Two points (seeds 0 and 1) of the quickstart sweep, run into a local folder."""
  tmp = tmp_path_factory.mktemp("sweep")
  (tmp / "spec.py").write_text(f"def get_sweep():\n  return {SWEEP!r}\n")
  run_sweep(tmp / "spec.py", tmp / "local")
  return tmp / "local"


def _rows(point) -> list[tuple]:
  return [(r["step"], r["split"], r.get("loss")) for r in metric_writers.read_metrics(point)]


@pytest.mark.slow
def test_sweep_with_points_on_gs_equals_local(local_sweep, fake_gcs):
  record = run_sweep(local_sweep.parent / "spec.py", "gs://bucket/sweep")
  local = json.loads((local_sweep / "sweep.json").read_text())
  assert record["finished"] == local["finished"] == 2
  bucket = fake_gcs / "bucket/sweep"
  far = json.loads((bucket / "sweep.json").read_text())
  assert far["workdir"] == "gs://bucket/sweep"
  assert ([(p["name"], p["status"], p["overrides"]) for p in far["points"]]
          == [(p["name"], p["status"], p["overrides"]) for p in local["points"]])
  for p in far["points"]:
    assert _rows(f"gs://bucket/sweep/{p['name']}") == _rows(local_sweep / p["name"])
    assert f"--workdir gs://bucket/sweep/{p['name']}" in p["command"]
    assert (bucket / p["name"] / "log.txt").read_text().startswith("# bertjax.sweep ")
  logs = {p.name: p.read_bytes() for p in bucket.glob("*/log.txt")}
  again = run_sweep(local_sweep.parent / "spec.py", "gs://bucket/sweep")
  assert again["skipped"] == 2 and again["finished"] == 2
  assert {p.name: p.read_bytes() for p in bucket.glob("*/log.txt")} == logs


@pytest.mark.slow
def test_report_over_gs_points_equals_local(local_sweep, fake_gcs, tmp_path, capsys):
  shutil.copytree(local_sweep, tmp_path / "local")  # the fixture's folder stays as it was
  remote = on_bucket(fake_gcs, local_sweep, "sweep")
  report.main([str(tmp_path / "local")])
  report.main([remote])
  out = capsys.readouterr().out
  assert f"wrote {remote}/report.md, train_loss.png, dev_curve.png, dev_vs_lr.png" in out
  bucket = fake_gcs / "bucket/sweep"
  for name in ("report.md", "train_loss.json", "dev_vs_lr.json"):
    want = (tmp_path / "local" / name).read_text().replace(str(tmp_path / "local"), remote)
    assert (bucket / name).read_text() == want, name
  assert "2 points: 2 finished" in (bucket / "report.md").read_text()
  for name in ("train_loss.png", "dev_vs_lr.png"):
    assert (bucket / name).stat().st_size > 0
  with pytest.raises(UserError, match="sweep folder gs://bucket/none not found"):
    report.main(["gs://bucket/none"])


@pytest.mark.slow
def test_multiseed_on_gs_equals_local(fake_gcs, tmp_path):
  config = load_config(SWEEP["config"])
  config_lib.apply_overrides(config, FAST)
  want = multiseed.run_seeds(config, tmp_path / "local", seeds=[0, 1])
  got = multiseed.run_seeds(config, "gs://bucket/seeds", seeds=[0, 1])
  assert got == want and sorted(got["runs"]) == ["0", "1"]
  assert (json.loads((fake_gcs / "bucket/seeds/seeds_summary.json").read_text())
          == json.loads((tmp_path / "local/seeds_summary.json").read_text()))
  for seed in (0, 1):
    assert _rows(f"gs://bucket/seeds/seed_{seed}") == _rows(tmp_path / f"local/seed_{seed}")
