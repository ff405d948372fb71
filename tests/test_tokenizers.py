"""Tests for bertjax.data.tokenizers.

Parity: no pretrained vocabulary can be downloaded, so the tests train small WordPiece and
byte-level BPE vocabularies on WikiText with the `tokenizers` library, then require our loaders
to give exactly the ids of transformers' independent slow Python tokenizers (BertTokenizer,
RobertaTokenizer) on real WikiText and SQuAD text, accented and non-Latin characters included.
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import subprocess
import sys
import unicodedata

import numpy as np
import pytest

from bertjax.core import errors
from bertjax.data import tokenizers as T
from bertjax.data.tokenizers import __main__ as tokenizers_cli

REPO = pathlib.Path(__file__).resolve().parent.parent

# Lines with accents in composed form, CJK, Cyrillic and punctuation that the real data may lack.
EXTRA_LINES = [
    "Café Ñandú naïve Zürich Ångström façade São Paulo Þingvellir Łódź Dvořák",
    "北京大学 is in 北京; Москва is Moscow, and Ελλάδα is Greece!",
    "He said: \"don't\" -- it's 3.14 (approx.) vs. 2,718; e-mail foo@bar.com #tag",
]


def _wikitext_lines(data_dir: pathlib.Path, name: str, n: int) -> list[str]:
  with open(data_dir / "wikitext2" / name, encoding="utf-8") as f:
    lines = [line.strip() for line in f if line.strip()]
  return lines[:n]


def _squad_lines(data_dir: pathlib.Path) -> list[str]:
  data = json.loads((data_dir / "squad" / "v1.1_dev_subset.json").read_text(encoding="utf-8"))
  out = []
  for article in data["data"]:
    for para in article["paragraphs"]:
      out.append(para["context"])
      out.extend(q["question"] for q in para["qas"])
  return out


# The data_dir fixture is per test, so the expensive set-up below is cached per module by hand.
_CACHE: dict = {}


def _cached(key, build):
  if key not in _CACHE:
    _CACHE[key] = build()
  return _CACHE[key]


@pytest.fixture
def corpus(data_dir) -> dict[str, list[str]]:
  return _cached(("corpus", str(data_dir)), lambda: {
      "train": _wikitext_lines(data_dir, "wiki.test.tokens", 3000),
      "eval": (_wikitext_lines(data_dir, "wiki.valid.tokens", 800)
               + _wikitext_lines(data_dir, "wiki.test.raw", 800)[-400:]
               + _squad_lines(data_dir)[:1200] + EXTRA_LINES),
  })


def _train_wordpiece(lines: list[str], directory: pathlib.Path, lowercase: bool) -> pathlib.Path:
  from tokenizers import BertWordPieceTokenizer
  trainer = BertWordPieceTokenizer(lowercase=lowercase)
  trainer.train_from_iterator(lines + EXTRA_LINES, vocab_size=3000, min_frequency=2,
                              show_progress=False)
  trainer.save_model(str(directory))
  return directory


@pytest.fixture
def wordpiece_dir(corpus, tmp_path_factory) -> pathlib.Path:
  return _cached("wordpiece", lambda: _train_wordpiece(
      corpus["train"], tmp_path_factory.mktemp("wordpiece"), lowercase=True))


@pytest.fixture
def cased_wordpiece_dir(corpus, tmp_path_factory) -> pathlib.Path:
  return _cached("wordpiece_cased", lambda: _train_wordpiece(
      corpus["train"], tmp_path_factory.mktemp("wordpiece_cased"), lowercase=False))


def _train_bpe(lines: list[str], directory: pathlib.Path) -> pathlib.Path:
  from tokenizers import ByteLevelBPETokenizer
  trainer = ByteLevelBPETokenizer()
  trainer.train_from_iterator(lines, vocab_size=2000, min_frequency=2,
                              special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                              show_progress=False)
  trainer.save_model(str(directory))
  return directory


@pytest.fixture
def bpe_dir(corpus, tmp_path_factory) -> pathlib.Path:
  return _cached("bpe", lambda: _train_bpe(corpus["train"], tmp_path_factory.mktemp("bpe")))


@pytest.fixture
def spm_tokenizer(corpus) -> T.SentencePieceTokenizer:
  return _cached("spm", lambda: T.train_sentencepiece(
      corpus["train"][:1500], None, vocab_size=1200, num_threads=1))


def test_wordpiece_uncased_matches_transformers_bert_tokenizer(wordpiece_dir, corpus):
  from transformers import BertTokenizer
  ref = BertTokenizer(str(wordpiece_dir / "vocab.txt"), do_lower_case=True)
  ours = T.load_tokenizer(wordpiece_dir)
  assert ours.kind == "wordpiece" and ours.lowercase  # inferred: the vocab has no upper case
  lines = corpus["eval"]
  assert len(lines) > 2000
  assert any(unicodedata.normalize("NFD", l) != l for l in lines)  # accents are exercised
  expected = [ref.encode(l, add_special_tokens=False) for l in lines]
  got = ours.encode_batch(lines)
  mismatches = [(l, e, g) for l, e, g in zip(lines, expected, got) if e != g]
  assert not mismatches, mismatches[0]
  assert [ours.encode(l) for l in lines[:50]] == expected[:50]
  # Accents are stripped, case folded: the vocabulary was trained that way.
  assert ours.encode("CAFÉ Zürich") == ours.encode("cafe zurich")
  for name in ("pad", "unk", "cls", "sep", "mask"):
    assert getattr(ours, f"{name}_id") == getattr(ref, f"{name}_token_id")
  assert ours.vocab_size == len(ref)


def test_wordpiece_cased_matches_transformers(cased_wordpiece_dir, corpus):
  from transformers import BertTokenizer
  ref = BertTokenizer(str(cased_wordpiece_dir / "vocab.txt"), do_lower_case=False)
  ours = T.load_tokenizer(cased_wordpiece_dir)
  assert not ours.lowercase  # inferred from the upper-case tokens in vocab.txt
  lines = corpus["eval"][::3]
  expected = [ref.encode(l, add_special_tokens=False) for l in lines]
  assert ours.encode_batch(lines) == expected
  assert ours.encode("Paris") != ours.encode("paris")


def test_roberta_bpe_matches_transformers_roberta_tokenizer(bpe_dir, corpus):
  from transformers import RobertaTokenizer
  ref = RobertaTokenizer(str(bpe_dir / "vocab.json"), str(bpe_dir / "merges.txt"))
  ours = T.load_tokenizer(bpe_dir)
  assert ours.kind == "bpe"
  lines = corpus["eval"]
  assert any("<unk>" in l for l in lines)  # WikiText's <unk> is RoBERTa's special token
  expected = [ref.encode(l, add_special_tokens=False) for l in lines]
  got = ours.encode_batch(lines)
  mismatches = [(l, e, g) for l, e, g in zip(lines, expected, got) if e != g]
  assert not mismatches, mismatches[0]
  assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (
      ref.pad_token_id, ref.unk_token_id, ref.cls_token_id, ref.sep_token_id, ref.mask_token_id)
  # Byte-level BPE is lossless (WikiText's "<unk>" is kept when specials are not skipped).
  for line in lines[:300]:
    assert ours.decode(ours.encode(line), skip_special_tokens=False) == line
  line = "a <unk> b"
  assert ours.decode(ours.encode(line)) == ref.decode(ref.encode(line, add_special_tokens=False),
                                                      skip_special_tokens=True)


def test_word_start_mask_wordpiece(wordpiece_dir, corpus):
  from transformers import BertTokenizer
  ref = BertTokenizer(str(wordpiece_dir / "vocab.txt"), do_lower_case=True)
  tok = T.load_tokenizer(wordpiece_dir)
  mask = tok.word_start_mask()
  assert mask.dtype == np.bool_ and mask.shape == (tok.vocab_size,)
  assert mask[list(tok.special_ids)].all()
  assert 0 < (~mask).sum() < tok.vocab_size
  for line in corpus["eval"][:300]:
    ids = tok.encode(line)
    # One word start per word of BERT's own basic (pre-)tokenizer.
    assert int(mask[ids].sum()) == len(ref.basic_tokenizer.tokenize(line)), line


def test_word_start_mask_bpe(bpe_dir):
  from transformers import RobertaTokenizer
  ref = RobertaTokenizer(str(bpe_dir / "vocab.json"), str(bpe_dir / "merges.txt"))
  tok = T.load_tokenizer(bpe_dir)
  mask = tok.word_start_mask()
  tokens = ref.convert_ids_to_tokens(list(range(tok.vocab_size)))
  expected = np.array([t.startswith("Ġ") for t in tokens])
  specials = list(tok.special_ids)
  expected[specials] = True
  # Besides 'Ġ', whitespace bytes such as newline ('Ċ') also begin a word.
  other = mask & ~expected
  assert all(tokens[i][0] in "Ċĉč" for i in np.flatnonzero(other))
  assert (mask | ~expected).all()
  text = " the cat sat on the mattress, quickly"
  assert int(mask[tok.encode(text)].sum()) == len(text.split())


def test_sentencepiece_reserved_ids_and_round_trip(spm_tokenizer, corpus):
  tok = spm_tokenizer
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert [tok.id_to_token(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert tok.vocab_size == 1200 and tok.special_ids == (0, 1, 2, 3, 4)
  lines = corpus["eval"][:500]
  encoded = tok.encode_batch(lines)
  assert encoded[:20] == [tok.encode(l) for l in lines[:20]]
  flat = np.concatenate([np.asarray(e) for e in encoded])
  assert flat.min() >= 1 and flat.max() < tok.vocab_size
  assert not np.isin(flat, [0, 2, 3, 4]).any()  # specials only ever come from the pipeline
  # Specials written in text stay text.
  assert not set(tok.encode("[CLS] [MASK]")) & {0, 2, 3, 4}
  exact = 0
  for line, ids in zip(lines, encoded):
    if tok.unk_id in ids:
      continue
    assert tok.decode(ids) == unicodedata.normalize("NFKC", " ".join(line.split())), line
    exact += 1
  assert exact > 0.8 * len(lines)
  text = tok.decode([tok.cls_id] + tok.encode("the game") + [tok.sep_id], skip_special_tokens=False)
  assert text == "[CLS] the game [SEP]"
  assert tok.decode([tok.cls_id] + tok.encode("the game") + [tok.pad_id]) == "the game"


def test_sentencepiece_word_start_mask(spm_tokenizer, corpus):
  tok = spm_tokenizer
  mask = tok.word_start_mask()
  assert mask[:5].all()
  starts = [tok.id_to_token(i).startswith("▁") for i in range(5, tok.vocab_size)]
  assert mask[5:].tolist() == starts
  checked = 0
  for line in corpus["eval"][:200]:
    ids = tok.encode(line)
    if tok.unk_id in ids:  # an unknown character mid-word is a special, hence a "start"
      continue
    assert int(mask[ids].sum()) == len(line.split()), line
    checked += 1
  assert checked > 100


def test_sentencepiece_bpe_lowercase_and_save_load(corpus, tmp_path):
  tok = T.train_sentencepiece(corpus["train"][:800], tmp_path / "tok", vocab_size=600,
                              model_type="bpe", lowercase=True, num_threads=1)
  assert tok.encode("The Game WAS") == tok.encode("the game was")
  loaded = T.load_tokenizer(tmp_path / "tok")
  assert isinstance(loaded, T.SentencePieceTokenizer) and loaded.lowercase
  lines = corpus["eval"][:100]
  assert loaded.encode_batch(lines) == tok.encode_batch(lines)
  clone = pickle.loads(pickle.dumps(tok))
  assert clone.encode_batch(lines) == tok.encode_batch(lines)
  np.testing.assert_array_equal(clone.word_start_mask(), tok.word_start_mask())


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_vocab_too_large_is_user_error(corpus, model_type):
  with pytest.raises(errors.UserError, match=r"smaller --vocab_size \(at most \d+\)") as e:
    T.train_sentencepiece(corpus["train"][:50], None, vocab_size=50_000, model_type=model_type,
                          num_threads=1)
  assert "\n" not in str(e.value)


def test_sentencepiece_vocab_too_small_and_empty_are_user_errors(corpus):
  with pytest.raises(errors.UserError, match="larger --vocab_size"):
    T.train_sentencepiece(corpus["eval"][:300], None, vocab_size=20, num_threads=1)
  with pytest.raises(errors.UserError, match="no sentences"):
    T.train_sentencepiece(["", "  "], None, vocab_size=100, num_threads=1)


def test_save_load_round_trip_all_kinds(wordpiece_dir, bpe_dir, spm_tokenizer, tmp_path, corpus):
  lines = corpus["eval"][-60:]
  for i, tok in enumerate([T.load_tokenizer(wordpiece_dir), T.load_tokenizer(bpe_dir),
                           spm_tokenizer]):
    out = tmp_path / str(i)
    tok.save(out)
    config = json.loads((out / T.CONFIG_FILE).read_text())
    assert config["kind"] == tok.kind
    loaded = T.load_tokenizer(out)
    assert type(loaded) is type(tok)
    assert loaded.encode_batch(lines) == tok.encode_batch(lines)
    assert loaded.special_ids == tok.special_ids and loaded.vocab_size == tok.vocab_size
    np.testing.assert_array_equal(loaded.word_start_mask(), tok.word_start_mask())


def test_config_overrides_vocab_casing(wordpiece_dir, tmp_path):
  # An uncased-looking vocab with an explicit cased config must not lower-case.
  (tmp_path / "vocab.txt").write_bytes((wordpiece_dir / "vocab.txt").read_bytes())
  (tmp_path / T.CONFIG_FILE).write_text(json.dumps({"do_lower_case": False}))
  tok = T.load_tokenizer(tmp_path)
  assert not tok.lowercase
  assert tok.encode("The") != T.load_tokenizer(wordpiece_dir).encode("The")


def test_load_errors(tmp_path, wordpiece_dir):
  with pytest.raises(errors.UserError, match="does not exist"):
    T.load_tokenizer(tmp_path / "missing")
  with pytest.raises(errors.UserError, match="no tokenizer files"):
    T.load_tokenizer(tmp_path)
  (tmp_path / "vocab.txt").write_text("a\nb\n[UNK]\n")
  with pytest.raises(errors.UserError, match=r"no \[PAD\] token"):
    T.load_tokenizer(tmp_path)
  (tmp_path / T.CONFIG_FILE).write_text("{not json")
  with pytest.raises(errors.UserError, match="not valid JSON"):
    T.load_tokenizer(tmp_path)
  (tmp_path / T.CONFIG_FILE).write_text(json.dumps({"kind": "bpe"}))
  with pytest.raises(errors.UserError, match="lacks vocab.json"):
    T.load_tokenizer(tmp_path)
  bad = tmp_path / "spm"
  bad.mkdir()
  (bad / "spm.model").write_bytes(b"garbage")
  with pytest.raises(errors.UserError, match="not a sentencepiece model"):
    T.load_tokenizer(bad)


def _run_cli(*args: str, cwd: pathlib.Path = REPO) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "bertjax.data.tokenizers", *args], cwd=cwd,
                        capture_output=True, text=True, timeout=120,
                        env={**os.environ, "PYTHONPATH": str(REPO)})


def test_cli_train_and_errors(corpus, tmp_path):
  a, b = tmp_path / "a.txt", tmp_path / "b.txt"
  a.write_text("\n".join(corpus["train"][:300]) + "\n", encoding="utf-8")
  b.write_text("\n".join(corpus["train"][300:600]) + "\n", encoding="utf-8")
  out = tmp_path / "tok"
  r = _run_cli("train", "--input", str(a), "--input", str(tmp_path / "b*.txt"), "--output",
               str(out), "--vocab_size", "500", "--model_type", "bpe", "--lowercase")
  assert r.returncode == 0, r.stderr
  tok = T.load_tokenizer(out)
  assert tok.kind == "sentencepiece" and tok.vocab_size == 500 and tok.lowercase
  assert tok.encode("The") == tok.encode("the")

  fresh = tmp_path / "tok2"  # the inputs' mistakes (one holding a tokenizer is refused first)
  empty = tmp_path / "empty.txt"
  empty.write_text("\n  \n")
  for args, message in [
      (["train", "--input", str(empty), "--output", str(fresh), "--vocab_size", "500"],
       "no text found"),
      (["train", "--input", str(tmp_path / "nothing*.txt"), "--output", str(fresh),
        "--vocab_size", "500"], "matches no file"),
      (["train", "--input", str(a), "--output", str(fresh), "--vocab_size", "900000"],
       "smaller --vocab_size"),
      (["train", "--input", str(a), "--output", str(fresh)], "--vocab_size"),
      (["train", "--input", str(a), "--output", str(fresh), "--vocab_size", "500",
        "--model_type", "word"], "invalid choice"),
  ]:
    r = _run_cli(*args)
    assert r.returncode == 2, (args, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr
  assert not fresh.exists()


def test_cli_train_keeps_a_tokenizer_already_there(tmp_path):
  """ea9bcfe's `train --output RUN/tokenizer` replaced a run's tokenizer without a word, and
  the run resumed on a corpus made with the old one (an export then ships the wrong vocabulary)."""
  out = tmp_path / "run" / "tokenizer"
  out.mkdir(parents=True)
  (out / T.SPM_FILE).write_bytes(b"the run's model")
  (out / T.CONFIG_FILE).write_text('{"kind": "sentencepiece"}')
  sample = REPO / "bertjax/data/samples/wikitext2_test.raw"
  with pytest.raises(errors.UserError) as e:
    tokenizers_cli.main(["train", f"--input={sample}", f"--output={out}", "--vocab_size=300",
                         "--max_sentences=2000"])
  assert str(e.value) == (f"--output {out} already holds a tokenizer (spm.model, "
                          "tokenizer_config.json), which this would replace; nothing was "
                          "written: choose a new folder")
  assert (out / T.SPM_FILE).read_bytes() == b"the run's model"
  assert sorted(p.name for p in out.iterdir()) == [T.SPM_FILE, T.CONFIG_FILE]
