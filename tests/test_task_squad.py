"""SQuAD through the one trainer: offsets, windows and answer alignment, decoding against brute
force, v1.1 and v2.0 end to end on the real subsets, and bad input."""

import json
import logging
import os
import pathlib

import numpy as np
import pytest
import tokenizers as hf_tokenizers

from bertjax.config import config_lib
from bertjax.core.errors import UserError
from bertjax.data import tokenizers
from bertjax.evaluators import squad as squad_evaluator
from bertjax.evaluators.squad import SquadEvaluator
from bertjax.metrics import span_decoding, squad as squad_eval
from bertjax.registry import get_objective
from bertjax.runtime import checkpoints, sharding
from bertjax.runtime.metric_writers import read_metrics
from bertjax.tasks import squad
from bertjax.trainer import eval_context, train

from helpers import REPO, TINY, load_config, run_module


def squad_config(variant: str, **overrides):
  return load_config(f"configs/squad.py:{variant}", **{**TINY, **overrides})


def subset(data_dir, version: str, titles, tmp_path, name: str, extra=None) -> pathlib.Path:
  """A SQuAD json of some articles of the shared subset (plus `extra` articles), in tmp_path."""
  src = data_dir / "squad" / f"v{version}_dev_subset.json"
  data = json.loads(src.read_text(encoding="utf-8"))
  data["data"] = [a for a in data["data"] if a["title"] in titles] + list(extra or [])
  path = tmp_path / name
  path.write_text(json.dumps(data), encoding="utf-8")
  return path


def contexts(data_dir, version="1.1"):
  _, examples = squad_eval.read_squad(data_dir / "squad" / f"v{version}_dev_subset.json")
  return examples


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory):
  """A sentencepiece tokenizer trained on the SQuAD subsets' passages and questions."""
  data = pathlib.Path(os.environ.get("BERTJAX_DATA", REPO.parent / "shared" / "data"))
  if not data.is_dir():  # as the data_dir fixture, which a module-scoped fixture cannot use
    pytest.skip(f"shared data not found at {data}; set BERTJAX_DATA to its folder")
  examples = contexts(data) + contexts(data, "2.0")
  texts = list(dict.fromkeys(e["context"] for e in examples)) + [e["question"] for e in examples]
  out = tmp_path_factory.mktemp("spm")
  tokenizers.train_sentencepiece(texts, out, vocab_size=2000, num_threads=1)
  return out


# ---------------------------------------------------------------------------------------------
# Offsets, windows, alignment.


def _wordpiece(tmp_path, texts):
  import collections
  import re
  words = collections.Counter(w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower()))
  chars = sorted({c for w in words for c in w})
  vocab = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + [f"##{c}" for c in chars]
           + [w for w, _ in words.most_common(500) if w not in chars])
  (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
  return tokenizers.WordPieceTokenizer(tmp_path / "vocab.txt", lowercase=True)


def _bpe(tmp_path, texts):
  bpe = hf_tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(texts, vocab_size=600,
                          special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  bpe.save_model(str(tmp_path))
  return tokenizers.ByteLevelBPETokenizer(tmp_path / "vocab.json", tmp_path / "merges.txt")


def test_offsets_cover_the_text_for_every_tokenizer_kind(tmp_path, data_dir, spm_dir):
  examples = contexts(data_dir)
  texts = list(dict.fromkeys(e["context"] for e in examples))[:60]
  texts.append("Café  déjà-vu: naïve ﬁne Ａ — 50%, “quoted” ")
  toks = {"sentencepiece": tokenizers.load_tokenizer(spm_dir),
          "wordpiece": _wordpiece(tmp_path, texts), "bpe": _bpe(tmp_path, texts)}
  for kind, tok in toks.items():
    for text in texts:
      ids, offsets = tok.encode_with_offsets(text)
      assert ids == tok.encode(text), kind
      covered = np.zeros(len(text), int)
      prev = 0
      for a, b in offsets:
        assert prev <= a <= b <= len(text), (kind, text[a:b])
        assert text[a:b] == text[a:b].strip()  # whitespace is never part of a token's span
        covered[a:b] += 1
        prev = a
      # Every non-space character belongs to a token, spaces to none; only byte-level BPE may
      # split one (multi-byte) character over several tokens, each then spanning all of it.
      space = np.array([c.isspace() for c in text], bool)
      assert (covered[space] == 0).all() and (covered[~space] >= 1).all(), (kind, text[:60])
      shared = np.flatnonzero(covered > 1)
      assert kind == "bpe" or not shared.size, (kind, [text[i] for i in shared])
      assert all(len(text[i].encode()) > 1 for i in shared), [text[i] for i in shared]


def test_windows_and_answer_alignment(data_dir, spm_dir):
  tok = tokenizers.load_tokenizer(spm_dir)
  examples = [e for e in contexts(data_dir) if e["context"]][:300]
  f = squad.Featurizer(tok, max_seq_length=64, doc_stride=16, max_query_length=16)
  multi = 0
  for ex in examples:
    ids, _ = f.passage(ex["context"])
    windows = f.windows(ex)
    multi += len(windows) > 1
    covered = np.zeros(len(ids), int)
    starts = np.zeros(len(ids), int)
    for w in windows:
      s, l, off = w["doc_start"], w["doc_length"], w["query_length"] + 2
      assert off + l + 1 <= 64 and sum(w["attention_mask"]) == off + l + 1
      assert w["input_ids"][off:off + l].tolist() == ids[s:s + l]
      assert w["token_type_ids"][off - 1] == 0 and w["token_type_ids"][off] == 1
      covered[s:s + l] = 1
      starts[s:s + l] += w["start_mask"][off:off + l]
      assert not w["passage_mask"][:off].any() and w["passage_mask"][off:off + l].all()
    assert covered.all()  # the windows cover the whole passage
    assert (starts == 1).all()  # each token has its maximal context in exactly one window
    where = f.answer_tokens(ex)
    assert not isinstance(where, str), where
    ts, te = where
    answer = ex["answers"][0]["text"]
    for w in windows:
      s, l, off = w["doc_start"], w["doc_length"], w["query_length"] + 2
      if s <= ts and te < s + l:
        _, _, text = span_decoding.span_to_text(ex["context"], w["offsets"], ts - s + off,
                                                te - s + off)
        # Token boundaries may reach past the answer's characters, never cut into them.
        assert answer.strip() in text and len(text) <= len(answer) + 12, (answer, text)
  assert multi > 50  # long passages really were split

  arrays, counts = squad.train_features(f, examples, "1.1")
  assert counts["examples"] + counts.get("outside_window", 0) == len(examples)
  assert counts["windows"] == len(arrays["input_ids"])
  assert (arrays["start_position"] <= arrays["end_position"]).all()
  assert (arrays["start_position"] > 0).sum() >= counts["examples"]  # each used answer placed


def test_decode_matches_brute_force():
  """The bucketed, padded, chunked decoding finds the same best span as a loop over all spans."""
  rng = np.random.default_rng(0)
  seq, max_len = 12, 4
  examples, feats = [], []
  for e, n_windows in enumerate([1, 3, 2, 5, 1, 4]):
    context = " ".join(f"w{e}{k}" for k in range(40))
    examples.append({"id": f"q{e}", "context": context})
    for w in range(n_windows):
      passage = np.zeros(seq, bool)
      passage[3:3 + rng.integers(2, seq - 3)] = True
      offsets = np.full((seq, 2), -1, np.int32)
      for p in np.flatnonzero(passage):
        k = (w * 5 + p) % 40
        offsets[p] = (4 * k if k < 10 else 40 + 5 * (k - 10),) * 2
        offsets[p, 1] += 3 if k < 10 else 4
      feats.append({"owner": e, "passage": passage, "start": passage & (rng.random(seq) < 0.8),
                    "offsets": offsets})
  start = rng.normal(size=(len(feats), seq)).astype(np.float32)
  end = rng.normal(size=(len(feats), seq)).astype(np.float32)
  meta = {"examples": examples, "example_index": np.array([f["owner"] for f in feats]),
          "passage_mask": np.stack([f["passage"] for f in feats]),
          "start_mask": np.stack([f["start"] for f in feats]),
          "offsets": np.stack([f["offsets"] for f in feats])}
  nbest, odds = squad.decode(start, end, meta, max_answer_length=max_len, n_best=5)
  for e, ex in enumerate(examples):
    best, best_score, null = None, -np.inf, np.inf
    for fi, f in enumerate(feats):
      if f["owner"] != e:
        continue
      null = min(null, start[fi, 0] + end[fi, 0])
      for i in range(seq):
        for j in range(i, min(seq, i + max_len)):
          if f["start"][i] and f["passage"][i] and f["passage"][j]:
            score = start[fi, i] + end[fi, j]
            if score > best_score:
              best_score = score
              best = ex["context"][f["offsets"][i, 0]:f["offsets"][j, 1]]
    assert nbest[e][0]["text"] == best
    assert nbest[e][0]["score"] == pytest.approx(best_score, abs=1e-5)
    assert odds[e] == pytest.approx(null - best_score, abs=1e-5)
    scores = [x["score"] for x in nbest[e]]
    assert scores == sorted(scores, reverse=True) and len({x["text"] for x in nbest[e]}) == len(
        scores)


# ---------------------------------------------------------------------------------------------
# End to end.


def _long_answer_article(data_dir):
  """One question whose answer (a whole long passage) fits in no 96-token window."""
  ex = [e for e in contexts(data_dir) if len(e["context"]) > 900][0]
  return {"title": "long", "paragraphs": [{"context": ex["context"], "qas": [{
      "id": "long-answer", "question": "What does the whole passage say?",
      "answers": [{"text": ex["context"], "answer_start": 0}]}]}]}


@pytest.mark.slow
def test_squad_v11_end_to_end(tmp_path, data_dir, spm_dir, capsys, caplog):
  subset(data_dir, "1.1", {"Super_Bowl_50"}, tmp_path, "train.json",
         extra=[_long_answer_article(data_dir)])
  dev_file = subset(data_dir, "1.1", {"Normans"}, tmp_path, "dev.json")
  workdir = tmp_path / "run"
  config = squad_config("runlocal", data_dir=str(tmp_path), train_file="train.json",
                        dev_file="dev.json", max_seq_length=96, doc_stride=48,
                        max_query_length=24, num_epochs=3.0, max_train_examples=0,
                        batch_size=32, eval_batch_size=32, log_every=10,
                        **{"data.tokenizer": str(spm_dir), "model.vocab_size": 2000})
  with caplog.at_level(logging.INFO):  # the lines are logged where logging is set up, else printed
    summary = train.train_and_evaluate(config, workdir)
  said = capsys.readouterr().out.splitlines() + [r.getMessage() for r in caplog.records]
  report = [l for l in said if l.startswith("squad v1.1 train")]
  assert len(report) == 1 and "811 questions -> 810 used" in report[0], said
  assert "skipped 1 whose answer lies outside every window" in report[0]

  rows = read_metrics(workdir)
  losses = [r["loss"] for r in rows if r["split"] == "train"]
  assert losses[-1] < 0.75 * losses[0], losses
  dev_rows = [l for l in said if l.startswith("squad v1.1 dev")]
  windows = int(dev_rows[0].split(" in ")[1].split()[0])
  assert windows % 32  # the last prediction batch is a partial one
  final = workdir / "predictions" / f"step_{summary['step']}"
  predictions = json.loads((final / "predictions.json").read_text())
  _, gold = squad_eval.read_squad(dev_file)
  assert sorted(predictions) == sorted(e["id"] for e in gold)  # every question, once
  nbest = json.loads((final / "nbest_predictions.json").read_text())
  for ex in gold:
    entries = nbest[ex["id"]]
    assert entries and entries[0]["text"] == predictions[ex["id"]]
    assert sum(e["probability"] for e in entries) == pytest.approx(1.0, abs=1e-6)
    for e in entries:  # exact context substrings, mapped through the offsets
      assert ex["context"][e["start"]:e["end"]] == e["text"]
  last = [r for r in rows if r["split"] == "eval"][-1]
  assert last["total"] == len(gold)
  proc = run_module("-m", "bertjax.tools.evaluate", "squad", "--data", str(dev_file),
                    "--predictions", str(final / "predictions.json"), "--version", "1.1")
  assert proc.returncode == 0, proc.stderr
  scored = json.loads(proc.stdout.strip().splitlines()[-1])
  assert scored["exact_match"] == pytest.approx(last["exact_match"], abs=1e-9)
  assert scored["f1"] == pytest.approx(last["f1"], abs=1e-9)
  assert last["f1"] > last["exact_match"] >= 0 and last["f1"] > 1.0

  # A predictions file that misses ids: one line naming the first missing id, exit 2.
  missing = dict(predictions)
  first = gold[0]["id"]
  del missing[first]
  (tmp_path / "partial.json").write_text(json.dumps(missing))
  proc = run_module("-m", "bertjax.tools.evaluate", "squad", "--data", str(dev_file),
                    "--predictions", str(tmp_path / "partial.json"))
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert proc.stderr.count("\n") == 1 and first in proc.stderr and "lack 1 of" in proc.stderr


@pytest.mark.slow
def test_squad_v20_end_to_end(tmp_path, data_dir, spm_dir):
  """v2.0: null odds for every question, "" exactly where they exceed the threshold, the
  threshold tuned on dev reported, and the files scored as the run scored them."""
  train_file = subset(data_dir, "2.0", {"Normans", "Southern_California"}, tmp_path, "tr.json")
  dev_file = subset(data_dir, "2.0", {"Sky_(United_Kingdom)"}, tmp_path, "dv.json")
  workdir = tmp_path / "run"
  settings = dict(data_dir=str(tmp_path), train_file=train_file.name, dev_file=dev_file.name,
                  max_seq_length=96, doc_stride=48, max_query_length=24, total_steps=30,
                  eval_every=30, batch_size=32, eval_batch_size=16, log_every=10,
                  **{"data.tokenizer": str(spm_dir), "model.vocab_size": 2000})
  config = squad_config("version=2.0,runlocal", **settings)
  summary = train.train_and_evaluate(config, workdir)
  final = workdir / "predictions" / f"step_{summary['step']}"
  predictions = json.loads((final / "predictions.json").read_text())
  odds = json.loads((final / "null_odds.json").read_text())
  _, gold = squad_eval.read_squad(dev_file, version="2.0")
  assert sorted(predictions) == sorted(odds) == sorted(e["id"] for e in gold)
  last = [r for r in read_metrics(workdir) if r["split"] == "eval"][-1]
  assert last["null_threshold"] == 0.0 and last["NoAns_total"] + last["HasAns_total"] == len(gold)
  assert "best_f1_thresh" in last and "best_f1" in last  # the threshold tuned on dev

  def scored_by_cli(directory):
    proc = run_module("-m", "bertjax.tools.evaluate", "squad", "--data", str(dev_file),
                      "--predictions", str(directory / "predictions.json"), "--null_odds",
                      str(directory / "null_odds.json"))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])

  scored = scored_by_cli(final)
  for key in ("exact", "f1", "HasAns_f1", "NoAns_f1", "best_f1", "best_f1_thresh", "best_exact"):
    assert scored[key] == pytest.approx(last[key], abs=1e-9), key

  # The same parameters evaluated again at the median odds: about half the questions abstain.
  threshold = float(np.median(list(odds.values())))
  config2 = squad_config("version=2.0,runlocal", null_score_diff_threshold=threshold, **settings)
  objective = get_objective(config2)
  data = objective.build_inputs(config2, tmp_path / "again")
  context = eval_context.standalone(config2, objective, objective.model_config(config2), data,
                                    tmp_path / "again", sharding.make_mesh(config2.mesh_shape),
                                    total_steps=config2.total_steps)
  metrics = dict(SquadEvaluator(config2, context).run(checkpoints.restore_params(workdir), 7))
  again = tmp_path / "again" / "predictions" / "step_7"
  odds2 = json.loads((again / "null_odds.json").read_text())
  predictions2 = json.loads((again / "predictions.json").read_text())
  nbest = json.loads((again / "nbest_predictions.json").read_text())
  for qid, o in odds2.items():
    assert o == pytest.approx(odds[qid], abs=1e-4)
    assert predictions2[qid] == ("" if o > threshold else nbest[qid][0]["text"])
  empty = sum(p == "" for p in predictions2.values())
  assert 0 < empty < len(predictions2)
  scored = scored_by_cli(again)
  assert metrics["null_threshold"] == threshold
  for key in ("exact", "f1", "HasAns_exact", "NoAns_exact", "best_f1", "best_f1_thresh"):
    assert scored[key] == pytest.approx(metrics[key], abs=1e-9), key


def test_file_of_the_other_version_is_one_line_exit_2(tmp_path, data_dir):
  v1 = data_dir / "squad" / "v1.1_dev_subset.json"
  env = ["--config.data_dir=" + str(tmp_path), f"--config.train_file={v1}",
         f"--config.dev_file={v1}"]
  proc = run_module("launch.py", "--config", "configs/squad.py:version=2.0,runlocal",
                    "--workdir", str(tmp_path / "w"), *env, timeout=120)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "is SQuAD v1.1, not v2.0" in errors[0], proc.stderr[-2000:]


def test_runlocal_says_it_scores_the_questions_it_trains_on(data_dir):
  """runlocal trains on 600 questions of the subset it evaluates on: its start says so in one
  line, and its docstring too; a dev set apart from the training questions gets no line. Reads
  the subset only (no training)."""
  config = load_config("configs/squad.py:runlocal", data_dir=str(data_dir / "squad"))
  train_examples = squad.read_examples(config, "train")[0][:config.max_train_examples]
  dev = squad.read_examples(config, "dev")[0]
  assert squad.scored_as_trained(train_examples, dev) == (
      f"warning: 600 of the {len(dev)} dev questions are among the 600 trained on: the dev "
      "scores are on examples the run trains on (a smoke test, not a measure of reading); give "
      "a dev_file the run does not train on to measure")
  trained = {ex["id"] for ex in train_examples}
  assert squad.scored_as_trained(train_examples, [e for e in dev if e["id"] not in trained]) == ""
  assert "It scores the examples it trains on" in (REPO / "configs/squad.py").read_text()


def test_config_checks(tmp_path):
  config = squad_config("runlocal", max_query_length=120)
  with pytest.raises(UserError, match="leaves fewer than 8 passage tokens"):
    get_objective(config).build_inputs(config, tmp_path)
  config = squad_config("runlocal", data_dir=str(tmp_path), train_file="", dev_file="")
  with pytest.raises(UserError, match=r"SQuAD train file not found: .*train-v1.1.json"):
    get_objective(config).build_inputs(config, tmp_path)
  with pytest.raises(UserError, match="version='3.0' is not one of"):
    config_lib.load_config_file(str(REPO / "configs/squad.py") + ":version=3.0")


def test_v2_headline_says_what_the_threshold_is_and_when_nothing_is_answered():
  """The default threshold 0 is not called "tuned on dev"; a run that answers no question says
  so; a threshold better than answering none is reported as the one to set. On dd89774 the line
  read "tuned on dev: best f1 ... at threshold 0.0000" whatever the sweep found."""
  none_answered = {"exact": 50.0, "f1": 50.0, "total": 10, "NoAns_total": 5, "HasAns_total": 5,
                   "best_f1": 50.0, "best_f1_thresh": 0.0}
  line = squad_evaluator.v2_headline(none_answered, 0.0, answered=0)
  assert line.startswith("squad v2.0 dev exact 50.00 f1 50.00 at null threshold 0 (the default, "
                         "not tuned); 0 of 10 questions answered (every question predicted "
                         "unanswerable")
  assert "tuned on dev:" not in line and "threshold 0.0000" not in line
  assert line.endswith("no threshold beats answering none (f1 50.00), so none was tuned on dev")
  tuned = {**none_answered, "f1": 40.0, "best_f1": 62.5, "best_f1_thresh": -1.25}
  line = squad_evaluator.v2_headline(tuned, 2.0, answered=7)
  assert "at null threshold 2; 7 of 10 questions answered; best on dev: f1 62.50 at threshold " \
      "-1.2500 (set --config.null_score_diff_threshold to use it)" in line
  assert "unanswerable" not in line
