"""Ragged synthetic batches: rows whose lengths follow a document-length distribution, padded (one
instance per row) or packed (several per row, segment ids), built by the pretraining pipeline.

The benchmark's default rows (bertjax.inputs.SyntheticBatches) are 50-100% full, whatever the
data. Real pretraining data is ragged: a paragraph-sized document fills a sixth of a 1024-token
row. Here synthetic documents of random tokens take their lengths from a distribution, and go
through the pipeline a run uses (`pipeline.make_pretraining_iterator`, kind 'single': each
document [CLS] text [SEP], cut into pieces of max_seq_length; `data.pack` packs them first-fit
over `data.pack_bins` rows with segment ids), masked as the run's objective masks. A padded batch
and a packed one then hold the same documents' tokens at different densities, and their real
tokens (the attention mask's ones) tell what a step really trains on.

Distributions (`parse`), each of a document's length in tokens, [CLS] and [SEP] included (a
longer document than a row is cut: rows of max_seq_length and the rest):
  wikitext2           the paragraphs of WikiText-2's test split (the sample shipped in
                      bertjax/data/samples), tokenized as the runlocal recipes tokenize it: a
                      sentencepiece model of `LOCAL_VOCAB` pieces trained on that sample (seed 0,
                      one thread), each paragraph's sentences encoded and summed, plus 2. 2,185
                      paragraphs, mean 169.4 tokens, median 155, 10% under 16, largest 743.
                      `WIKITEXT2_PARAGRAPHS` holds the counts; `measure_wikitext` measures them
                      again (tests/test_ragged.py checks that it gives the same).
  wikitext2-articles  the same sample's 62 articles (the documents the wikitext format reads),
                      mean 5,901 tokens: cut at 1024, mostly full rows.
  ragged:MEAN,MIN     MIN + a geometric number of tokens: lengths MIN, MIN+1, ... with
                      P(MIN + k) = p (1 - p)^k, p = 1 / (MEAN - MIN + 1), so the mean is MEAN and
                      the standard deviation sqrt(1 - p) / p (about MEAN - MIN): many short
                      documents and a long tail, as in web text.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import jax
import numpy as np

from bertjax.core.errors import UserError
from bertjax.data import pipeline, sources, tokenizers
from bertjax.data.masking import SpecialIds

# The runlocal recipes' sentencepiece vocabulary (configs/common.py LOCAL_VOCAB).
LOCAL_VOCAB = 4000
NAMES = ("full", "wikitext2", "wikitext2-articles", "ragged:MEAN,MIN")
NUM_DOCUMENTS = 100_000  # generated on demand: more than a benchmark reads
_DOC_TAG = 0x52414744  # keeps document seeds apart from other uses of the seed

# WikiText-2 test paragraphs: text tokens (without [CLS] and [SEP]) -> paragraphs of that many,
# measured by `measure_wikitext` (see the module docstring).
WIKITEXT2_PARAGRAPHS = {
    1: 3, 2: 8, 3: 9, 4: 33, 5: 19, 6: 30, 7: 24, 8: 13, 9: 21, 10: 13, 11: 14, 12: 13, 13: 15,
    14: 6, 15: 17, 16: 11, 17: 13, 18: 9, 19: 6, 20: 7, 21: 5, 22: 10, 23: 6, 24: 6, 25: 8, 26: 5,
    27: 1, 28: 3, 29: 11, 30: 7, 31: 7, 32: 1, 33: 2, 34: 4, 35: 3, 36: 2, 37: 5, 38: 5, 39: 7,
    40: 3, 41: 6, 42: 3, 43: 6, 44: 3, 45: 3, 46: 4, 47: 1, 48: 2, 49: 3, 50: 6, 51: 5, 52: 4, 53:
    5, 54: 3, 55: 5, 56: 7, 57: 6, 58: 6, 59: 5, 60: 6, 61: 2, 62: 4, 63: 4, 64: 5, 65: 4, 66: 5,
    67: 2, 68: 3, 69: 4, 70: 4, 71: 6, 72: 3, 73: 8, 74: 8, 75: 4, 76: 4, 77: 4, 78: 5, 79: 8, 80:
    3, 81: 2, 82: 5, 83: 8, 84: 3, 85: 2, 86: 7, 87: 6, 88: 6, 89: 4, 90: 8, 91: 10, 92: 7, 93: 6,
    94: 9, 95: 9, 96: 7, 97: 10, 98: 7, 99: 9, 100: 6, 101: 7, 102: 6, 103: 8, 104: 6, 105: 10,
    106: 10, 107: 5, 108: 8, 109: 4, 110: 4, 111: 6, 112: 4, 113: 8, 114: 7, 115: 10, 116: 8, 117:
    5, 118: 8, 119: 10, 120: 5, 121: 8, 122: 12, 123: 2, 124: 3, 125: 9, 126: 7, 127: 11, 128: 8,
    129: 6, 130: 6, 131: 4, 132: 10, 133: 8, 134: 6, 135: 5, 136: 9, 137: 6, 138: 13, 139: 11,
    140: 10, 141: 10, 142: 9, 143: 8, 144: 12, 145: 7, 146: 8, 147: 12, 148: 4, 149: 12, 150: 9,
    151: 8, 152: 3, 153: 5, 154: 7, 155: 7, 156: 11, 157: 6, 158: 12, 159: 6, 160: 4, 161: 5, 162:
    5, 163: 4, 164: 6, 165: 4, 166: 7, 167: 8, 168: 14, 169: 12, 170: 7, 171: 10, 172: 8, 173: 4,
    174: 8, 175: 6, 176: 13, 177: 8, 178: 11, 179: 4, 180: 10, 181: 7, 182: 6, 183: 8, 184: 3,
    185: 11, 186: 13, 187: 6, 188: 7, 189: 5, 190: 5, 191: 7, 192: 4, 193: 7, 194: 7, 195: 8, 196:
    7, 197: 4, 198: 7, 199: 8, 200: 8, 201: 9, 202: 10, 203: 7, 204: 5, 205: 7, 206: 4, 207: 4,
    208: 10, 209: 4, 210: 5, 211: 5, 212: 5, 213: 3, 214: 9, 215: 5, 216: 2, 217: 8, 218: 7, 219:
    2, 220: 3, 221: 3, 222: 2, 223: 6, 224: 5, 225: 4, 226: 3, 227: 5, 228: 3, 229: 7, 230: 4,
    231: 5, 232: 6, 233: 7, 234: 2, 235: 5, 236: 2, 237: 5, 238: 3, 239: 3, 240: 1, 241: 9, 242:
    7, 243: 3, 244: 6, 245: 5, 246: 6, 247: 5, 248: 3, 249: 8, 250: 4, 251: 4, 252: 4, 253: 6,
    254: 9, 255: 3, 256: 2, 257: 5, 258: 3, 259: 7, 260: 6, 261: 4, 262: 4, 263: 2, 264: 4, 265:
    6, 266: 6, 267: 2, 268: 5, 269: 4, 270: 3, 271: 6, 272: 5, 273: 4, 274: 3, 275: 5, 276: 2,
    277: 1, 278: 4, 279: 4, 280: 2, 281: 3, 282: 4, 283: 5, 284: 3, 285: 1, 286: 2, 287: 1, 288:
    3, 289: 3, 290: 5, 291: 5, 292: 1, 293: 3, 294: 2, 295: 5, 296: 2, 297: 6, 298: 3, 299: 1,
    300: 4, 301: 5, 302: 4, 303: 6, 304: 4, 305: 6, 306: 2, 307: 2, 308: 1, 309: 2, 310: 1, 311:
    4, 312: 1, 313: 4, 314: 3, 315: 5, 316: 6, 317: 1, 318: 2, 319: 3, 320: 1, 321: 3, 322: 2,
    323: 8, 324: 1, 325: 5, 326: 1, 328: 5, 329: 4, 330: 1, 331: 2, 332: 3, 333: 5, 335: 2, 336:
    3, 337: 3, 338: 1, 339: 2, 340: 2, 341: 3, 342: 1, 344: 3, 345: 5, 346: 2, 347: 2, 348: 2,
    349: 1, 350: 1, 351: 3, 352: 3, 353: 3, 354: 2, 355: 1, 356: 1, 357: 4, 358: 2, 359: 2, 360:
    2, 362: 2, 363: 1, 364: 6, 366: 1, 367: 3, 369: 2, 372: 1, 373: 1, 377: 2, 378: 1, 380: 4,
    381: 1, 382: 2, 384: 3, 385: 1, 387: 2, 388: 4, 389: 2, 390: 1, 392: 3, 393: 2, 394: 2, 397:
    1, 399: 1, 400: 1, 401: 2, 402: 1, 403: 3, 404: 2, 406: 4, 407: 1, 408: 1, 409: 1, 410: 2,
    411: 2, 412: 1, 413: 1, 414: 2, 417: 1, 420: 3, 422: 1, 424: 1, 425: 1, 428: 1, 429: 1, 430:
    1, 431: 1, 432: 2, 433: 1, 435: 3, 437: 1, 442: 1, 443: 2, 444: 1, 446: 1, 453: 2, 454: 1,
    455: 1, 457: 1, 461: 1, 462: 1, 463: 1, 464: 1, 469: 1, 470: 1, 479: 2, 483: 2, 487: 1, 489:
    2, 491: 1, 496: 1, 497: 1, 498: 1, 499: 2, 502: 1, 503: 1, 504: 1, 510: 1, 514: 1, 516: 2,
    519: 1, 526: 1, 532: 1, 542: 1, 545: 1, 546: 1, 547: 1, 556: 1, 578: 1, 581: 1, 583: 1, 585:
    1, 588: 1, 590: 1, 597: 1, 603: 1, 620: 1, 639: 1, 649: 1, 654: 1, 741: 1,
}
# WikiText-2 test articles: text tokens of each, in file order.
WIKITEXT2_ARTICLES = (
    1706, 7104, 3688, 10709, 3091, 3639, 14545, 3406, 16000, 2581, 4715, 12902, 1435, 3520, 639,
    2344, 9645, 1638, 6026, 5581, 6552, 1927, 5683, 15651, 3501, 10406, 15745, 1818, 22, 339,
    6703, 2237, 8633, 2626, 13143, 10543, 2488, 21973, 6414, 13962, 16532, 3793, 1650, 7662, 3268,
    1650, 2023, 10201, 2134, 2336, 4280, 3811, 1625, 1483, 1545, 1378, 10273, 784, 4534, 8154,
    6045, 5330,
)


@dataclasses.dataclass(frozen=True)
class Lengths:
  """A distribution of document lengths in tokens ([CLS] and [SEP] included), `sample`d by
  numpy's generator: `values` with probabilities `weights` (an empirical one), or MIN plus a
  geometric count (`ragged:MEAN,MIN`)."""
  name: str
  values: tuple[int, ...] = ()
  weights: tuple[float, ...] = ()
  mean: float | None = None
  minimum: int | None = None

  def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
    """<int64>[n] document lengths."""
    if self.values:  # inverse CDF
      cdf = np.cumsum(self.weights)
      at = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), len(cdf) - 1)
      return np.asarray(self.values)[at]
    p = 1.0 / (self.mean - self.minimum + 1.0)
    return self.minimum + rng.geometric(p, size=n) - 1

  def moments(self) -> tuple[float, float]:
    """The distribution's mean and standard deviation."""
    if self.values:
      v, w = np.asarray(self.values, float), np.asarray(self.weights)
      mean = float(v @ w)
      return mean, float(np.sqrt(((v - mean) ** 2) @ w))
    p = 1.0 / (self.mean - self.minimum + 1.0)
    return float(self.mean), float(np.sqrt(1.0 - p) / p)


def _empirical(name: str, text_lengths: dict[int, int]) -> Lengths:
  values = sorted(text_lengths)
  counts = np.asarray([text_lengths[v] for v in values], float)
  return Lengths(name, tuple(v + 2 for v in values), tuple(counts / counts.sum()))


def parse(spec: str) -> Lengths | None:
  """The distribution `--lengths spec` names; None for "full" (the default synthetic rows)."""
  usage = (f"--lengths {spec!r}: use full, wikitext2, wikitext2-articles or ragged:MEAN,MIN "
           "(tokens per document, [CLS] and [SEP] included; e.g. ragged:300,16)")
  if spec == "full":
    return None
  if spec == "wikitext2":
    return _empirical(spec, WIKITEXT2_PARAGRAPHS)
  if spec == "wikitext2-articles":
    counts: dict[int, int] = {}
    for n in WIKITEXT2_ARTICLES:
      counts[n] = counts.get(n, 0) + 1
    return _empirical(spec, counts)
  m = re.fullmatch(r"ragged:(\d+(?:\.\d+)?),(\d+)", spec or "")
  if not m:
    raise UserError(usage)
  mean, minimum = float(m.group(1)), int(m.group(2))
  if minimum < 3 or mean < minimum:
    raise UserError(f"--lengths {spec}: MIN must be at least 3 ([CLS], a token, [SEP]) and MEAN "
                    f"at least MIN; e.g. ragged:300,16")
  return Lengths(spec, mean=mean, minimum=minimum)


def row_lengths(document_lengths: Sequence[int], max_seq_length: int) -> list[int]:
  """The rows' lengths the pipeline cuts documents of these lengths into (kind 'single', one
  sentence each): pieces of max_seq_length - 2 text tokens, each with [CLS] and [SEP]."""
  room = max_seq_length - 2
  rows = []
  for length in document_lengths:
    text = int(length) - 2
    rows += [room + 2] * (text // room) + ([text % room + 2] if text % room else [])
  return rows


class RaggedDocuments(Sequence):
  """`num_documents` synthetic documents, each one sentence of random ordinary tokens (ids 5 and
  up) whose length, with [CLS] and [SEP], is drawn from `lengths`; document i depends on (seed,
  i) alone, so any of them can be read in any order."""

  def __init__(self, lengths: Lengths, vocab_size: int, seed: int,
               num_documents: int = NUM_DOCUMENTS):
    self.lengths, self.vocab_size, self.seed = lengths, vocab_size, seed
    self.num_documents = num_documents

  def __len__(self) -> int:
    return self.num_documents

  def length(self, i: int) -> int:
    """Document i's length in tokens, [CLS] and [SEP] included."""
    return int(self.lengths.sample(np.random.default_rng([self.seed, int(i), _DOC_TAG]), 1)[0])

  def __getitem__(self, i: int) -> list[np.ndarray]:
    if not 0 <= i < self.num_documents:
      raise IndexError(i)
    rng = np.random.default_rng([self.seed, int(i), _DOC_TAG])
    length = int(self.lengths.sample(rng, 1)[0])
    return [rng.integers(5, self.vocab_size, length - 2).astype(np.int32)]


def special_ids(vocab_size: int) -> SpecialIds:
  """The synthetic rows' special tokens, as bertjax.inputs.SyntheticBatches uses them."""
  return SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4, vocab_size=vocab_size)


def check_pack(config, objective) -> None:
  """Refuses packed rows for an objective that reads one sentence-pair label per row."""
  if config.data.pack and objective.data_kind not in ("full", "single"):
    raise UserError(f"packed rows (--pack, data.pack): objective {objective.name!r} reads a "
                    "sentence-pair label from each row's [CLS], one per row; pack rows for an "
                    "objective without one (e.g. --objective mlm) or give --no-pack")


def ragged_batches(config, objective, lengths: Lengths, vocab_size: int, seed: int,
                   per_process: int):
  """The pipeline's iterator of `per_process`-row batches (this process's share of each global
  batch) of `RaggedDocuments`: padded, or packed when `config.data.pack`; masked as `objective`
  masks (`objective.masking(config)`)."""
  check_pack(config, objective)
  documents = RaggedDocuments(lengths, vocab_size, seed)
  rows = pipeline.Instances(kind="single", max_seq_length=config.max_seq_length,
                            short_seq_prob=0.0, pack=bool(config.data.pack),
                            pack_bins=config.data.pack_bins)
  return pipeline.make_pretraining_iterator(
      documents, rows, objective.masking(config), batch_size=per_process, seed=seed,
      special=special_ids(vocab_size), word_start_mask=np.ones(vocab_size, bool),
      shard_index=jax.process_index(), shard_count=jax.process_count())


def measure_wikitext(path: str, vocab_size: int = LOCAL_VOCAB) -> tuple[dict[int, int], list[int]]:
  """(paragraph text lengths -> count, article text lengths) of a WikiText file, tokenized by a
  sentencepiece model of `vocab_size` pieces trained on it (seed 0, one thread, so the same
  each time): what `WIKITEXT2_PARAGRAPHS` and `WIKITEXT2_ARTICLES` hold for the shipped sample."""
  documents = sources.read_documents([path], "wikitext")
  tokenizer = tokenizers.train_sentencepiece(sources.iter_sentences(documents), None,
                                             vocab_size=vocab_size, seed=0, num_threads=1)
  count = lambda sentences: sum(len(ids) for ids in tokenizer.encode_batch(list(sentences)))
  articles = [count(doc) for doc in documents]
  paragraphs: dict[int, int] = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      line = line.strip()
      if not line or re.fullmatch(r"(=(?: =)*) \S.*? \1", line):
        continue
      n = count(sources.split_sentences(line))
      if n:
        paragraphs[n] = paragraphs.get(n, 0) + 1
  return dict(sorted(paragraphs.items())), articles
