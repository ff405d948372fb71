"""Every reader parses or fails with one line naming the file (issue #19), property-based.

Hypothesis feeds each reader (GLUE tsv, SQuAD json, CoNLL, corpus text, and the predictions files
of `python -m bertjax.tools.evaluate`) arbitrary bytes, well-formed text with junk bytes spliced in,
and structurally broken files (wrong column counts, missing keys, wrong json types, truncated json).
Each must return parsed data or raise `UserError` whose message is one line naming the file.
Examples are bounded and derandomized, so CI runs the same few hundred cases in seconds.
"""

from __future__ import annotations

import gzip
import json
import pathlib

import ml_collections
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertjax.core.errors import UserError
from bertjax.data import sources
from bertjax.metrics import glue, ner, squad
from bertjax.registry import get_objective
from bertjax.tasks import base, glue as glue_task, ner as ner_task, squad as squad_task
from bertjax.tools import evaluate

from helpers import TINY, load_config, run_module

READERS = settings(max_examples=50, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture,
                                          HealthCheck.too_slow])

ENDINGS = st.sampled_from(["\n", "\r\n", "\r"])
WORD = st.text(st.characters(exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp")), min_size=1,
               max_size=6)
CELL = st.one_of(st.text(st.characters(exclude_categories=("Cs",)), max_size=6), WORD)


def _lines(line: st.SearchStrategy[str], max_size: int = 8) -> st.SearchStrategy[str]:
  return st.tuples(st.lists(line, max_size=max_size), ENDINGS).map(
      lambda t: "".join(l + t[1] for l in t[0]))


def _splice(args: tuple[str, bytes, int]) -> bytes:
  text, junk, at = args
  data = text.encode("utf-8")
  at %= len(data) + 1
  return data[:at] + junk + data[at:]


def as_bytes(text: st.SearchStrategy[str]) -> st.SearchStrategy[bytes]:
  """Arbitrary bytes, `text` as UTF-8, or `text` with a few arbitrary bytes spliced in."""
  return st.one_of(st.binary(max_size=300), text.map(lambda s: s.encode("utf-8")),
                   st.tuples(text, st.binary(min_size=1, max_size=4),
                             st.integers(min_value=0)).map(_splice))


def parses_or_one_line(path: pathlib.Path, read, *also: pathlib.Path):
  """`read()`, or None after checking its `UserError` is one line naming `path` (or `also`)."""
  try:
    return read()
  except UserError as e:
    message = str(e)
    assert "\n" not in message and "\r" not in message, message
    assert any(str(p) in message for p in (path, *also)), message
    return None


# ---------------------------------------------------------------------------------------------
# GLUE tsv: the official files (training and evaluate's gold) and leaderboard predictions.

GLUE_SPLITS = [(name, split) for name, t in glue.GLUE_TASKS.items() for split in t.columns]


@st.composite
def glue_tsv(draw, task: str, split: str) -> str:
  """Rows of mostly the right width, cells drawn from the task's labels and arbitrary text."""
  t = glue.get_task(task)
  n = t.columns[split].num_columns
  cell = st.one_of(CELL, st.sampled_from([*t.labels, "0.5", "nan", "-1e999", "7"]))
  row = st.lists(cell, min_size=n, max_size=n) | st.lists(cell, max_size=n + 2)
  return draw(_lines(row.map("\t".join)))


@READERS
@given(data=st.data())
def test_glue_tsv(tmp_path, data):
  task, split = data.draw(st.sampled_from(GLUE_SPLITS))
  t = glue.get_task(task)
  path = tmp_path / t.glue_dir / t.files[split]
  path.parent.mkdir(exist_ok=True)
  path.write_bytes(data.draw(as_bytes(glue_tsv(task, split))))
  rows = parses_or_one_line(path, lambda: glue.read_glue_tsv(path, task, split))
  for r in rows or []:
    assert isinstance(r["sentence1"], str)
    assert r["label"] is None if split == "test" else r["label"] is not None
  if task in glue_task.TASKS and split != "test":  # the trainer's reader of the same file
    config = ml_collections.ConfigDict({"data_dir": str(tmp_path)})
    spec = glue_task.Split("", task, f"glue/{task}", "")
    got = parses_or_one_line(path, lambda: glue_task.read_rows(config, spec, split, True))
    assert got == rows


@READERS
@given(data=st.data())
def test_glue_tsv_round_trip(tmp_path, data):
  """Well-formed rows (any text without tabs or line breaks) read back exactly."""
  text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\t\r\n"))
  pairs = data.draw(st.lists(st.tuples(text, text, st.sampled_from(glue.get_task("rte").labels)),
                             min_size=1, max_size=5))
  lines = ["index\tsentence1\tsentence2\tlabel"]
  lines += [f"{i}\t{a}\t{b}\t{label}" for i, (a, b, label) in enumerate(pairs)]
  path = tmp_path / "dev.tsv"
  path.write_text(data.draw(ENDINGS).join(lines), encoding="utf-8", newline="")
  rows = glue.read_glue_tsv(path, "rte", "dev")
  assert [(r["sentence1"], r["sentence2"]) for r in rows] == [(a, b) for a, b, _ in pairs]


@READERS
@given(data=st.data())
def test_glue_predictions(tmp_path, data):
  task = data.draw(st.sampled_from(sorted(glue.LEADERBOARD_FILES)))
  t = glue.get_task(task)
  index = st.integers(-2, 2**70).map(str) | CELL
  value = st.sampled_from([*t.labels, "0.25", "nan", "inf"]) | CELL
  row = st.tuples(index, value).map("\t".join) | st.lists(CELL, max_size=3).map("\t".join)
  header = st.sampled_from(["index\tprediction", "Index\tPrediction", "idx\tpred", ""])
  text = st.tuples(header, ENDINGS, _lines(row)).map("".join)
  path = tmp_path / t.leaderboard_file
  path.write_bytes(data.draw(as_bytes(text)))
  got = parses_or_one_line(path, lambda: glue.read_predictions_tsv(path, task))
  if got is not None:
    index, preds = got
    assert index.shape == preds.shape and len(set(index.tolist())) == len(index)


# ---------------------------------------------------------------------------------------------
# SQuAD json (gold and training data) and its predictions / null odds files.

SQUAD_KEYS = ["version", "data", "title", "paragraphs", "context", "qas", "id", "question",
              "answers", "text", "answer_start", "is_impossible"]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**70) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(SQUAD_KEYS) | st.text(max_size=3), inner, max_size=4),
    max_leaves=12)


def squad_doc(version: str) -> dict:
  qas = [{"id": "q1", "question": "Who?", "answers": [{"text": "Ada", "answer_start": 0}]},
         {"id": "q2", "question": "When?", "answers": [{"text": "1843", "answer_start": 13}]}]
  if version == "2.0":
    qas.append({"id": "q3", "question": "Why?", "answers": [], "is_impossible": True})
  return {"version": version, "data": [{"title": "t", "paragraphs": [
      {"context": "Ada wrote in 1843.", "qas": qas}]}]}


def _slots(obj) -> list:
  """(container, key) of every value inside a json value."""
  items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
  out = []
  for key, value in items:
    out.append((obj, key))
    out.extend(_slots(value))
  return out


@st.composite
def broken_json(draw, doc) -> str:
  """`doc` with a few values deleted or replaced by arbitrary json, maybe truncated."""
  doc = json.loads(json.dumps(doc))
  for _ in range(draw(st.integers(0, 3))):
    slots = _slots(doc)
    if not slots:
      break
    container, key = draw(st.sampled_from(slots))
    if draw(st.booleans()):
      del container[key]
    else:
      container[key] = draw(JSON)
  text = json.dumps(doc)
  if draw(st.booleans()):
    text = text[:draw(st.integers(0, len(text)))]
  return text


@READERS
@given(data=st.data())
def test_squad_json(tmp_path, data):
  version = data.draw(st.sampled_from([None, "1.1", "2.0"]))
  text = broken_json(squad_doc(data.draw(st.sampled_from(["1.1", "2.0"])))) | JSON.map(json.dumps)
  path = tmp_path / "train.json"
  path.write_bytes(data.draw(as_bytes(text)))
  got = parses_or_one_line(path, lambda: squad.read_squad(path, version=version))
  for ex in got[1] if got else []:
    assert all(isinstance(ex[k], str) for k in ("id", "question", "context"))
    assert all(isinstance(a["text"], str) and isinstance(a["answer_start"], int)
               for a in ex["answers"])
    assert ex["answers"] or got[0] == "2.0"  # v1.1 questions all have answers
  config = ml_collections.ConfigDict({"data_dir": str(tmp_path), "train_file": str(path),
                                      "version": version or "1.1"})
  train = parses_or_one_line(path, lambda: squad_task.read_examples(config, "train"))
  assert train is None or train[0]


@READERS
@given(data=st.data())
def test_squad_predictions(tmp_path, data):
  _, gold = squad.read_squad(_write(tmp_path / "gold.json", json.dumps(squad_doc("2.0"))))
  preds = {"q1": "Ada", "q2": "", "q3": ""}
  text = broken_json(preds) | broken_json({"q1": 0.5, "q2": -1, "q3": 2}) | JSON.map(json.dumps)
  path = tmp_path / "predictions.json"
  path.write_bytes(data.draw(as_bytes(text)))
  numbers = data.draw(st.booleans())
  what = "null odds" if numbers else "predictions"

  def read():
    values = squad.read_squad_predictions(path, what)
    squad.check_prediction_file(path, values, gold, what, numbers=numbers)
    return values
  got = parses_or_one_line(path, read)
  assert got is None or set(got) == {"q1", "q2", "q3"}


# ---------------------------------------------------------------------------------------------
# CoNLL-2003 (training data and evaluate's gold) and `token tag` predictions.

TAGS = st.sampled_from(["O", "B-PER", "I-LOC", "E-ORG", "S-MISC", "B-", "X-PER", "NNP", "B-NP"])
CONLL_LINE = st.one_of(st.just(""), st.just("-DOCSTART- -X- -X- O"),
                       st.lists(WORD | TAGS, min_size=1, max_size=5).map(" ".join),
                       st.tuples(WORD, TAGS, TAGS, TAGS).map(" ".join),
                       st.tuples(WORD, TAGS).map(" ".join))


@READERS
@given(data=st.data())
def test_conll(tmp_path, data):
  path = tmp_path / "train.txt"
  path.write_bytes(data.draw(as_bytes(_lines(CONLL_LINE, 10))))
  for read in (ner.read_conll, ner.read_ner_predictions):
    for s in parses_or_one_line(path, lambda: read(path)) or []:
      assert s.tokens and len(s.tokens) == len(s.tags) and s.line >= 1
  config = ml_collections.ConfigDict({"data_dir": str(tmp_path), "train_file": str(path)})
  got = parses_or_one_line(path, lambda: ner_task.read_sentences(config, "ner", "train"))
  assert got is None or (got[0] and all(set(t) <= set(ner_task.NER_LABELS) for _, t in got[0]))


# ---------------------------------------------------------------------------------------------
# Corpus text files (pretraining data, tokenizer training), plain and gzipped.

CORPUS_LINE = st.one_of(st.just(""), st.just(" = Title = "), st.just(" = = Section = = "),
                        st.lists(WORD, min_size=1, max_size=6).map(" ".join), CELL)


@READERS
@given(data=st.data())
def test_corpus_text(tmp_path, data):
  raw = data.draw(as_bytes(_lines(CORPUS_LINE, 10)))
  fmt = data.draw(st.sampled_from(sources.FORMATS))
  path = tmp_path / "corpus.txt"
  if data.draw(st.booleans()):
    path = tmp_path / "corpus.txt.gz"
    raw = bytearray(gzip.compress(raw, mtime=0))
    damage = data.draw(st.sampled_from(["none", "truncate", "overwrite"]))
    at = data.draw(st.integers(10, len(raw) - 1))  # past the 10-byte gzip header
    if damage == "truncate":
      raw = raw[:at]
    elif damage == "overwrite":
      raw[at] = data.draw(st.integers(0, 255))
    raw = bytes(raw)
  path.write_bytes(raw)
  docs = parses_or_one_line(path, lambda: list(sources.TextFileSource(str(path), format=fmt)))
  for doc in docs or []:
    assert doc and all(isinstance(s, str) and s for s in doc)


# ---------------------------------------------------------------------------------------------
# The evaluate CLI: valid gold files, broken predictions files.


def _write(path: pathlib.Path, text: str) -> pathlib.Path:
  path.write_text(text, encoding="utf-8")
  return path


def _gold_files(root: pathlib.Path) -> dict[str, tuple[list[str], list[pathlib.Path], str]]:
  """Per benchmark: the CLI arguments on valid gold files, those files, and a valid
  predictions text."""
  rte = _write(root / "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n"
               "1\tc\td\tnot_entailment\n2\te\tf\tentailment\n")
  sq = _write(root / "dev-v2.0.json", json.dumps(squad_doc("2.0")))
  odds = _write(root / "odds.json", json.dumps({"q1": -1.0, "q2": 0.5, "q3": 2.0}))
  conll = _write(root / "valid.txt", "-DOCSTART- -X- -X- O\n\nAda NNP B-NP B-PER\nwrote VBD "
                 "B-VP O\n\nIn IN B-PP O\nParis NNP B-NP B-LOC\n")
  return {
      "glue": (["glue", "--task", "rte", "--data", str(rte)], [rte],
               "index\tprediction\n0\tentailment\n1\tentailment\n2\tnot_entailment\n"),
      "squad": (["squad", "--data", str(sq), "--null_odds", str(odds)], [sq, odds],
                json.dumps({"q1": "Ada", "q2": "1843", "q3": ""})),
      "ner": (["ner", "--data", str(conll)], [conll], "Ada B-PER\nwrote O\n\nIn O\nParis B-LOC\n"),
  }


@st.composite
def edited_lines(draw, text: str) -> str:
  """`text` with a few lines dropped, repeated or replaced."""
  lines = text.splitlines()
  for _ in range(draw(st.integers(0, 3))):
    k = draw(st.integers(0, len(lines)))
    op = draw(st.sampled_from(["drop", "repeat", "replace"]))
    if op == "drop" and k < len(lines):
      del lines[k]
    elif op == "repeat" and k < len(lines):
      lines.insert(k, lines[k])
    else:
      lines[k:k + 1] = [draw(CELL | st.lists(WORD | TAGS, max_size=3).map("\t".join))]
  return "\n".join(lines) + "\n"


@READERS
@given(data=st.data())
def test_evaluate_cli(tmp_path, data, capsys):
  benchmark = data.draw(st.sampled_from(["glue", "squad", "ner"]))
  args, gold, valid = _gold_files(tmp_path)[benchmark]
  edited = broken_json(json.loads(valid)) if benchmark == "squad" else edited_lines(valid)
  path = tmp_path / "predictions"
  path.write_bytes(data.draw(as_bytes(edited)))
  result = parses_or_one_line(path, lambda: evaluate.main([*args, "--predictions", str(path)]),
                              *gold)
  assert result is None or result["benchmark"] == benchmark
  capsys.readouterr()


# ---------------------------------------------------------------------------------------------
# The red team's defects, one by one: training reads (and fails) before any tokenizer is built.


def _build_inputs(spec: str, tmp_path, monkeypatch, **settings):
  """The task's build_inputs, with the tokenizer (the first step after reading) forbidden."""
  def reached(*args, **kwargs):
    raise AssertionError("the data was read without error; a tokenizer was about to be built")
  monkeypatch.setattr(base.TaskObjective, "load_tokenizer", reached)
  config = load_config(spec, **{**TINY, **settings})
  objective = get_objective(config)
  return lambda: objective.build_inputs(config, tmp_path / "workdir")


def _one_line_error(build) -> str:
  with pytest.raises(UserError) as e:
    build()
  assert "\n" not in str(e.value)
  return str(e.value)


def _cli(*args) -> str:
  """`python -m bertjax.tools.evaluate ARGS`: exit 2 with one line on stderr and no traceback."""
  proc = run_module("-m", "bertjax.tools.evaluate", *map(str, args), timeout=60)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
  return lines[0][len("error: "):]


RTE_ROWS = "index\tsentence1\tsentence2\tlabel\n0\tA man sleeps.\tA man rests.\tentailment\n"


def test_glue_tsv_that_is_not_utf8(tmp_path, monkeypatch):
  (tmp_path / "RTE").mkdir()
  train = tmp_path / "RTE" / "train.tsv"
  train.write_bytes(RTE_ROWS.encode() + b"1\tCaf\xe9 au lait.\tA drink.\tentailment\n")
  (tmp_path / "RTE" / "dev.tsv").write_text(RTE_ROWS)
  message = _one_line_error(_build_inputs("configs/glue.py:task=rte", tmp_path, monkeypatch,
                                          data_dir=str(tmp_path)))
  bad = f"{train}:3: byte {len(RTE_ROWS) + 5} (0xe9) is not valid UTF-8 (invalid continuation"
  assert message.startswith(bad), message
  predictions = _write(tmp_path / "RTE.tsv", "index\tprediction\n0\tentailment\n")
  assert _cli("glue", "--task", "rte", "--data", train, "--predictions",
              predictions).startswith(bad)  # read as a dev file, the same line and byte
  predictions.write_bytes(b"index\tprediction\n0\tentailment\xff\n")
  assert _cli("glue", "--data", tmp_path / "RTE" / "dev.tsv", "--predictions",
              predictions).startswith(f"{predictions}:2: byte 29 (0xff) is not valid UTF-8")


def test_conll_that_is_not_utf8(tmp_path, monkeypatch):
  head = b"-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\n"
  train = tmp_path / "train.txt"
  train.write_bytes(head + b"r\xe9jects VBZ B-VP O\n")
  message = _one_line_error(_build_inputs("configs/ner.py", tmp_path, monkeypatch,
                                          data_dir=str(tmp_path), train_file="train.txt"))
  assert message.startswith(f"{train}:4: byte {len(head) + 1} (0xe9) is not valid UTF-8"), message
  predictions = _write(tmp_path / "pred.txt", "EU B-ORG\nrejects O\n")
  assert _cli("ner", "--data", train, "--predictions", predictions) == message
  gold = _write(tmp_path / "gold.txt", "EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n")
  predictions.write_bytes(b"EU B-ORG\nr\xe9jects O\n")
  assert _cli("ner", "--data", gold, "--predictions", predictions).startswith(
      f"{predictions}:2: byte 10 (0xe9) is not valid UTF-8")


def test_squad_v11_question_without_answers_fails_when_read(tmp_path, monkeypatch):
  doc = squad_doc("1.1")
  del doc["data"][0]["paragraphs"][0]["qas"][1]["answers"]
  path = _write(tmp_path / "train-v1.1.json", json.dumps(doc))
  message = _one_line_error(_build_inputs("configs/squad.py", tmp_path, monkeypatch,
                                          data_dir=str(tmp_path), dev_file=path.name))
  assert message.startswith(f"{path}: question data[0].paragraphs[0].qas[1] (id 'q2') has no "
                            "answers, and every SQuAD v1.1 question needs one; add its answers")
  assert "score it with version 2.0" not in message
  # evaluate says the same; asked for v2.0 it says the file is v1.1, and asking for v1.1 then
  # gives the message above, not the advice to ask for v2.0 again.
  predictions = _write(tmp_path / "pred.json", json.dumps({"q1": "Ada", "q2": "1843"}))
  assert _cli("squad", "--data", path, "--predictions", predictions) == message
  with pytest.raises(UserError, match=r"is SQuAD v1.1, not v2.0: .*ask for version 1.1"):
    evaluate.main(["squad", "--version", "2.0", "--data", str(path), "--predictions",
                   str(predictions)])
  example = {"id": "q", "question": "?", "context": "c", "answers": [], "is_impossible": False}
  with pytest.raises(UserError, match="1 questions without answers .* every SQuAD v1.1 question "
                     "needs one; add their answers"):
    squad.squad_metrics([example], {"q": ""}, version="1.1")


@pytest.mark.parametrize("content", ["", RTE_ROWS.splitlines(keepends=True)[0]])
def test_empty_glue_train_file_names_the_file(tmp_path, monkeypatch, content):
  (tmp_path / "RTE").mkdir()
  train = _write(tmp_path / "RTE" / "train.tsv", content)
  (tmp_path / "RTE" / "dev.tsv").write_text(RTE_ROWS)
  message = _one_line_error(_build_inputs("configs/glue.py:task=rte", tmp_path, monkeypatch,
                                          data_dir=str(tmp_path)))
  assert message == (f"{train}: no GLUE rte train examples (the file is empty or holds only a "
                     "header); use the official RTE/train.tsv with its rows")


def test_empty_training_data_names_the_file_not_another_tool(tmp_path, monkeypatch):
  train = _write(tmp_path / "train.txt", "-DOCSTART- -X- -X- O\n\n")
  message = _one_line_error(_build_inputs("configs/ner.py", tmp_path, monkeypatch,
                                          data_dir=str(tmp_path), train_file="train.txt"))
  assert message.startswith(f"{train} has no sentences; a CoNLL-2003 train file has")
  train = _write(tmp_path / "train-v1.1.json", json.dumps({"version": "1.1", "data": []}))
  message = _one_line_error(_build_inputs("configs/squad.py", tmp_path, monkeypatch,
                                          data_dir=str(tmp_path)))
  assert message == f"{train} has no questions; pass a SQuAD v1.1 train file with questions"
  # Rows whose sentences are all empty reach the tokenizer, which names the training data.
  monkeypatch.undo()
  (tmp_path / "CoLA").mkdir()
  _write(tmp_path / "CoLA" / "train.tsv", "gj04\t1\t\t\n")
  _write(tmp_path / "CoLA" / "dev.tsv", "gj04\t1\t\tA sentence.\n")
  config = load_config("configs/glue.py:task=cola", **{**TINY, "data_dir": str(tmp_path)})
  with pytest.raises(UserError, match=r"^glue: the training data has no text to train a "
                     r"tokenizer on; fill the training file, or set --config.data.tokenizer"):
    get_objective(config).build_inputs(config, tmp_path / "workdir")


def test_evaluate_refuses_ids_the_gold_data_lacks(tmp_path):
  args, _, valid = _gold_files(tmp_path)["squad"]
  predictions = _write(tmp_path / "pred.json", json.dumps({**json.loads(valid), "q9": "x"}))
  assert _cli(*args, "--predictions", predictions) == (
      f"{predictions} has 1 question ids not in the gold file (first: 'q9'); is it the "
      "predictions for another dataset or version?")
  odds = _write(tmp_path / "odds.json", json.dumps({"q1": 0.0, "q2": 0.0, "q3": 0.0, "x": 1}))
  with pytest.raises(UserError, match=f"^{odds} has 1 question ids not in the gold file"):
    evaluate.main([*args, "--predictions", str(_write(predictions, valid)), "--null_odds",
                   str(odds)])
  args, _, valid = _gold_files(tmp_path)["ner"]
  predictions = _write(tmp_path / "pred.txt", valid + "\nLater O\n")
  with pytest.raises(UserError, match=f"^{predictions}: 3 predicted sentences for 2 gold"):
    evaluate.main([*args, "--predictions", str(predictions)])
  args, _, valid = _gold_files(tmp_path)["glue"]
  predictions = _write(tmp_path / "RTE.tsv", valid + "3\tentailment\n")
  with pytest.raises(UserError, match=f"^{predictions} has 1 indices not in the gold file"):
    evaluate.main([*args, "--predictions", str(predictions)])
