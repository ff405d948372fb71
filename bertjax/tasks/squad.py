"""SQuAD v1.1 / v2.0 extractive question answering, as BERT's run_squad does it.

Features: `[CLS] question [SEP] passage window [SEP]`, the question cut to `max_query_length`
tokens and the passage split into windows of what is left of `max_seq_length`, each starting
`doc_stride` tokens after the previous one. The passage is tokenized once, with character
offsets (`Tokenizer.encode_with_offsets`), so an answer's characters map to tokens and a
predicted token span maps back to the exact context substring.

Training: a TokenHead with two outputs gives start and end logits; the loss is the mean of the
start and end cross-entropies. A window that does not contain the answer (and every window of an
unanswerable v2.0 question) points both at [CLS]. A question whose answer lies in no window (it
is longer than a window, or crosses window boundaries with too little overlap), or whose answer
text does not match its context at `answer_start`, is skipped, counted and reported.

Decoding (`bertjax.metrics.span_decoding`, vectorized over windows): the best span over all
windows of a question, restricted to passage tokens, starting in a window where that token has
its maximal context, at most `max_answer_length` tokens long, plus the n-best list. v2.0: the
null score is [CLS]'s start + end logit; null_odds = null score - best span score, and a
question is answered "" when its odds exceed `null_score_diff_threshold`. The threshold that
would have been best on dev (the official script's best_f1_thresh) is reported with the metrics.

Its evaluator, bertjax/evaluators/squad.py, decodes and scores the dev questions and writes the
prediction files.
"""

from __future__ import annotations

import collections
import functools
import logging
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.core.errors import fail
from bertjax.metrics import span_decoding
from bertjax.metrics import squad as squad_eval
from bertjax.models import classifiers
from bertjax.tasks import base

_log = logging.getLogger(__name__)

# Masks padding out of the start/end softmax; finite so that sums of two stay finite.
_NEG = -1e9
# Decoding forms [examples, windows, seq, seq] scores; chunks stay below this many elements.
_DECODE_ELEMENTS = 1 << 24


# ---------------------------------------------------------------------------------------------
# Reading.


def _local(config) -> bool:
  return bool(config.data_dir or config.get("train_file") or config.get("dev_file"))


def scored_as_trained(train: list[dict[str, Any]], dev: list[dict[str, Any]]) -> str:
  """'' when no dev question is trained on, else the line that says the scores are on them
  (runlocal's: one subset is both files)."""
  trained = {ex["id"] for ex in train}
  both = sum(ex["id"] in trained for ex in dev)
  if not both:
    return ""
  return (f"warning: {both} of the {len(dev)} dev questions are among the {len(train)} trained "
          "on: the dev scores are on examples the run trains on (a smoke test, not a measure of "
          "reading); give a dev_file the run does not train on to measure")


def read_examples(config, split: str) -> tuple[list[dict[str, Any]], str]:
  """Examples (as `evaluation.squad.read_squad` gives them) of `split` (train | dev), and where
  they came from. A file of the other SQuAD version, a malformed one (a v1.1 question without
  answers included) or one without questions is refused here, before any training."""
  version = squad_eval.normalize_version(config.version)
  if _local(config):
    key, stem = ("train_file", "train") if split == "train" else ("dev_file", "dev")
    path = base.resolve_file(config, config.get(key, ""), f"{stem}-v{version}.json")
    if not path.is_file():
      fail(f"SQuAD {split} file not found: {path}; set --config.data_dir (and "
           f"--config.{key}) to the official SQuAD v{version} json ({base.data_folder_hint()})")
    _, examples = squad_eval.read_squad(path, version=version)
    if not examples:
      fail(f"{path} has no questions; pass a SQuAD v{version} {split} file with questions")
    return examples, str(path)
  name = f"squad/v{version}"
  source = base.open_tfds(name, "train" if split == "train" else "validation",
                          config.get("tfds_data_dir", ""))
  examples = []
  for i in range(len(source)):
    ex = source[i]
    answers = ex.get("answers", {})
    texts = [base.text(t) for t in np.asarray(answers.get("text", [])).tolist()]
    starts = [int(s) for s in np.asarray(answers.get("answer_start", [])).tolist()]
    examples.append({
        "id": base.text(ex["id"]), "question": base.text(ex["question"]),
        "context": base.text(ex["context"]),
        "answers": [{"text": t, "answer_start": s} for t, s in zip(texts, starts)],
        "is_impossible": bool(np.asarray(ex.get("is_impossible", False)).item()),
    })
  if not examples:
    fail(f"tfds {name} has no {split} questions; rebuild the dataset")
  return examples, f"tfds {name}"


# ---------------------------------------------------------------------------------------------
# Features.


def doc_spans(num_tokens: int, max_doc: int, stride: int) -> list[tuple[int, int]]:
  """(start, length) of the passage windows, as BERT's run_squad slides them; an empty passage
  still gets one (empty) window so its question gets a prediction."""
  spans = []
  start = 0
  while start < num_tokens:
    length = min(num_tokens - start, max_doc)
    spans.append((start, length))
    if start + length == num_tokens:
      break
    start += min(length, stride)
  return spans or [(0, 0)]


def max_context_windows(spans: Sequence[tuple[int, int]], num_tokens: int) -> np.ndarray:
  """<int>[num_tokens]: the window in which each passage token has the most context on both
  sides (min(left, right) + 0.01 * length, the first window winning ties, as BERT)."""
  best = np.zeros(num_tokens, np.int64)
  best_score = np.full(num_tokens, -np.inf)
  for w, (s, l) in enumerate(spans):
    p = np.arange(s, s + l)
    score = np.minimum(p - s, s + l - 1 - p) + 0.01 * l
    better = score > best_score[p]
    best[p[better]] = w
    best_score[p[better]] = score[better]
  return best


def _normalize_ws(s: str) -> str:
  return " ".join(s.split())


class Featurizer:
  """Question + passage -> windows, caching each passage's tokenization (questions share them)."""

  def __init__(self, tokenizer, max_seq_length: int, doc_stride: int, max_query_length: int):
    self.tok = tokenizer
    self.seq, self.stride, self.max_query = max_seq_length, doc_stride, max_query_length
    self._cache: dict[str, tuple[list[int], np.ndarray]] = {}

  def passage(self, context: str) -> tuple[list[int], np.ndarray]:
    if context not in self._cache:
      ids, offsets = self.tok.encode_with_offsets(context)
      self._cache[context] = (ids, np.asarray(offsets, np.int32).reshape(-1, 2))
    return self._cache[context]

  def windows(self, example: dict[str, Any]) -> list[dict[str, Any]]:
    """Every window of one question: model inputs plus offsets, passage and start masks."""
    q = self.tok.encode(example["question"])[:self.max_query]
    ids, offsets = self.passage(example["context"])
    max_doc = self.seq - len(q) - 3
    spans = doc_spans(len(ids), max_doc, self.stride)
    best = max_context_windows(spans, len(ids))
    off = len(q) + 2
    out = []
    for w, (s, l) in enumerate(spans):
      tokens = [self.tok.cls_id, *q, self.tok.sep_id, *ids[s:s + l], self.tok.sep_id]
      # numpy rows, not lists of Python ints: the full training set has ~130k windows.
      input_ids = np.full(self.seq, self.tok.pad_id, np.int32)
      input_ids[:len(tokens)] = tokens
      attention_mask = np.zeros(self.seq, np.int32)
      attention_mask[:len(tokens)] = 1
      token_type_ids = np.zeros(self.seq, np.int32)
      token_type_ids[off:len(tokens)] = 1
      row = {"input_ids": input_ids, "attention_mask": attention_mask,
             "token_type_ids": token_type_ids}
      offs = np.full((self.seq, 2), -1, np.int32)
      offs[off:off + l] = offsets[s:s + l]
      passage = np.zeros(self.seq, bool)
      passage[off:off + l] = True
      start_ok = np.zeros(self.seq, bool)
      start_ok[off:off + l] = best[s:s + l] == w
      row.update(offsets=offs, passage_mask=passage, start_mask=start_ok, doc_start=s,
                 doc_length=l, query_length=len(q))
      out.append(row)
    return out

  def answer_tokens(self, example: dict[str, Any]) -> tuple[int, int] | str:
    """First and last passage token of the first gold answer, or why there is none."""
    if not example["answers"]:
      return "no_answer"
    answer = example["answers"][0]
    context = example["context"]
    cs = int(answer["answer_start"])
    ce = cs + len(answer["text"])
    if not (0 <= cs and ce <= len(context)) or (
        _normalize_ws(context[cs:ce]) != _normalize_ws(answer["text"])):
      return "mismatched"
    _, offsets = self.passage(context)
    hit = np.flatnonzero((offsets[:, 0] < ce) & (offsets[:, 1] > cs)
                         & (offsets[:, 1] > offsets[:, 0]))
    if hit.size == 0:
      return "mismatched"
    return int(hit[0]), int(hit[-1])


_MODEL_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def train_features(featurizer: Featurizer, examples: Sequence[dict[str, Any]],
                   version: str) -> tuple[dict[str, np.ndarray], dict[str, int]]:
  """Training windows with start/end positions, and counts of what was skipped and why."""
  rows = []
  counts = collections.Counter()
  for ex in examples:
    windows = featurizer.windows(ex)
    for row in windows:  # decoding needs these, training does not: free them early
      for key in ("offsets", "passage_mask", "start_mask"):
        del row[key]
    if version == "2.0" and ex["is_impossible"]:
      for row in windows:
        row["start_position"] = row["end_position"] = 0
      rows.extend(windows)
      counts["examples"] += 1
      continue
    where = featurizer.answer_tokens(ex)
    if isinstance(where, str):
      counts[where] += 1
      _log.debug("skipping %s: %s", ex["id"], where)
      continue
    ts, te = where
    inside = 0
    for row in windows:
      s, l, off = row["doc_start"], row["doc_length"], row["query_length"] + 2
      if s <= ts and te < s + l:
        row["start_position"], row["end_position"] = ts - s + off, te - s + off
        inside += 1
      else:  # BERT: a window without the answer points at [CLS]
        row["start_position"] = row["end_position"] = 0
    if not inside:
      counts["outside_window"] += 1
      _log.debug("skipping %s: its answer (tokens %d..%d) lies in no window", ex["id"], ts, te)
      continue
    rows.extend(windows)
    counts["examples"] += 1
  keys = (*_MODEL_KEYS, "start_position", "end_position")
  arrays = base.stack(rows, keys, {k: np.int32 for k in keys})
  counts["windows"] = len(rows)
  return arrays, dict(counts)


def eval_features(featurizer: Featurizer, examples: Sequence[dict[str, Any]]) -> base.EvalSet:
  """Every window of every question; meta maps windows back to questions and characters."""
  rows, owner = [], []
  for i, ex in enumerate(examples):
    for row in featurizer.windows(ex):
      rows.append(row)
      owner.append(i)
  arrays = base.stack(rows, _MODEL_KEYS, {k: np.int32 for k in _MODEL_KEYS})
  meta = {"examples": list(examples), "example_index": np.asarray(owner, np.int64),
          "offsets": np.stack([r["offsets"] for r in rows]),
          "passage_mask": np.stack([r["passage_mask"] for r in rows]),
          "start_mask": np.stack([r["start_mask"] for r in rows])}
  return base.EvalSet(name="dev", arrays=arrays, meta=meta)


# ---------------------------------------------------------------------------------------------
# Decoding.


def decode(start_logits: np.ndarray, end_logits: np.ndarray, meta: dict[str, Any],
           max_answer_length: int, n_best: int) -> tuple[list[list[dict[str, Any]]], np.ndarray]:
  """Per question: its n-best answers [{text, score, start, end}] (best first, distinct texts)
  and its null odds (<float64>[questions]; +inf where no span is allowed)."""
  examples = meta["examples"]
  owner = meta["example_index"]
  seq = start_logits.shape[1]
  windows_of = [[] for _ in examples]
  for f, e in enumerate(owner):
    windows_of[e].append(f)
  # Questions grouped by window count rounded up to a power of two: a few compiled shapes.
  buckets: dict[int, list[int]] = collections.defaultdict(list)
  for e, feats in enumerate(windows_of):
    buckets[1 << (len(feats) - 1).bit_length()].append(e)
  nbest: list[list[dict[str, Any]]] = [[] for _ in examples]
  null_odds = np.full(len(examples), np.inf)
  for width, members in sorted(buckets.items()):
    chunk = max(1, min(len(members), _DECODE_ELEMENTS // (width * seq * seq)))
    for lo in range(0, len(members), chunk):
      group = members[lo:lo + chunk]
      # Padding windows (and padding questions) are masked out; they repeat feature 0.
      feats = np.zeros((chunk, width), np.int64)
      wmask = np.zeros((chunk, width), bool)
      for k, e in enumerate(group):
        feats[k, :len(windows_of[e])] = windows_of[e]
        wmask[k, :len(windows_of[e])] = True
      spans, null = jax.device_get(_decode_chunk(
          start_logits[feats], end_logits[feats], meta["passage_mask"][feats], wmask,
          meta["start_mask"][feats], max_answer_length=max_answer_length,
          n_best=min(n_best, width * seq * seq)))
      for k, e in enumerate(group):
        # The best span is the n-best list's first entry (top_k sorts descending); without a
        # valid span its score is -inf and the odds +inf.
        null_odds[e] = float(null[k]) - float(spans.score[k, 0])
        seen = set()
        for j in range(spans.valid.shape[1]):
          if not spans.valid[k, j]:
            break
          f = feats[k, spans.window[k, j]]
          cs, ce, answer = span_decoding.span_to_text(
              examples[e]["context"], meta["offsets"][f], int(spans.start[k, j]),
              int(spans.end[k, j]))
          if answer in seen:
            continue
          seen.add(answer)
          nbest[e].append({"text": answer, "score": float(spans.score[k, j]),
                           "start": cs, "end": ce})
  return nbest, null_odds


@functools.partial(jax.jit, static_argnames=("max_answer_length", "n_best"))
def _decode_chunk(start_logits, end_logits, passage_mask, window_mask, start_mask,
                  max_answer_length: int, n_best: int):
  """`span_decoding` over <[examples, windows, seq]> arrays: the n-best spans and null scores.

  Same as `span_decoding.decode_batch` without its `best`/`null_odds` fields, which the host
  derives from the n-best list: reading top_k's first entry inside the same XLA computation
  makes the CPU backend fully sort all windows * seq * seq scores (~30x slower here).
  """
  passage_mask = passage_mask & window_mask[..., None]

  def one(s, e, p, w, m):
    return (span_decoding.nbest_spans(s, e, p, max_answer_length, n_best, m),
            span_decoding.null_score(s, e, w))
  return jax.vmap(one)(start_logits, end_logits, passage_mask, window_mask, start_mask)


# ---------------------------------------------------------------------------------------------
# The task.


class SquadTask(base.TaskObjective):
  """Extractive QA on SQuAD v1.1 or v2.0 (`config.version`)."""
  name = "squad"
  evaluator = "squad"

  @classmethod
  def main_metric(cls, settings) -> str:
    """SQuAD's F1 over every dev question (v2.0: at the configured null threshold)."""
    del settings
    return "f1"

  def check(self, config) -> None:
    version_of(config)

  def prepare(self, config, workdir):
    version = version_of(config)
    if config.doc_stride <= 0 or config.max_query_length <= 0 or config.max_answer_length <= 0:
      fail("doc_stride, max_query_length and max_answer_length must be positive; fix the config")
    if config.max_seq_length - config.max_query_length - 3 < 8:
      fail(f"max_seq_length={config.max_seq_length} leaves fewer than 8 passage tokens after a "
           f"{config.max_query_length}-token question; raise max_seq_length or lower "
           "max_query_length")
    all_train, train_from = read_examples(config, "train")
    dev_examples, dev_from = read_examples(config, "dev")
    train_examples = all_train[:config.max_train_examples or None]

    def texts():  # a tokenizer trained here sees all the training text
      seen = set()
      for ex in all_train:
        if ex["context"] not in seen:
          seen.add(ex["context"])
          yield ex["context"]
        yield ex["question"]

    tok = self.load_tokenizer(config, workdir, texts)
    featurizer = Featurizer(tok, config.max_seq_length, config.doc_stride,
                            config.max_query_length)
    train, counts = train_features(featurizer, train_examples, version)
    skipped = {k: counts.get(k, 0) for k in ("outside_window", "mismatched", "no_answer")}
    base.announce(
        f"squad v{version} train ({train_from}): {len(train_examples)} questions -> "
        f"{counts.get('examples', 0)} used in {counts['windows']} windows; skipped "
        f"{skipped['outside_window']} whose answer lies outside every window, "
        f"{skipped['mismatched']} whose answer text does not match the context, "
        f"{skipped['no_answer']} without an answer")
    if skipped["outside_window"]:
      _log.warning("%d training answers lie outside every window (max_seq_length %d, "
                   "doc_stride %d); they were skipped", skipped["outside_window"],
                   config.max_seq_length, config.doc_stride)
    dev = eval_features(featurizer, dev_examples)
    dev.meta["source"] = dev_from
    base.announce(f"squad v{version} dev ({dev_from}): {len(dev_examples)} questions in "
                  f"{dev.num_rows} windows")
    if warning := scored_as_trained(train_examples, dev_examples):
      base.announce(warning)
    return base.Prepared(train=train, eval_sets=[dev], tokenizer=tok,
                         details={"questions": len(train_examples), **counts})

  def make_model(self, config, model_config):
    return classifiers.TokenClassifier(model_config, num_labels=2, head_name="qa_outputs",
                                       **base.head_options(config))

  def feature_spec(self, config, seq_len):
    return {"start_position": ((), jnp.int32), "end_position": ((), jnp.int32)}

  def predict(self, model, params, batch, rng, deterministic):
    logits = model.apply({"params": params}, **self.model_inputs(batch),
                         deterministic=deterministic, rngs={"dropout": rng})
    real = batch["attention_mask"] > 0
    start = jnp.where(real, logits[..., 0], _NEG)
    end = jnp.where(real, logits[..., 1], _NEG)
    w = batch["weight"].astype(jnp.float32)
    out = {"start_logits": start, "end_logits": end, "metrics": {}}
    if "start_position" not in batch:
      out["loss"] = jnp.zeros_like(w)
      return out
    sp = batch["start_position"].astype(jnp.int32)
    ep = batch["end_position"].astype(jnp.int32)
    ce = (optax.softmax_cross_entropy_with_integer_labels(start, sp)
          + optax.softmax_cross_entropy_with_integer_labels(end, ep)) / 2
    out["loss"] = ce * w
    out["metrics"] = {
        "start_accuracy": (jnp.sum((jnp.argmax(start, -1) == sp) * w), jnp.sum(w)),
        "end_accuracy": (jnp.sum((jnp.argmax(end, -1) == ep) * w), jnp.sum(w))}
    return out


def version_of(config) -> str:
  """`config.version` as "1.1" or "2.0" (refused in one line otherwise)."""
  return squad_eval.normalize_version(config.get("version", "1.1"))
