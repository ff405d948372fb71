"""A generated corpus whose words follow from their context: a check that an objective learns more
than unigram statistics.

On natural text a tiny model first falls to the corpus's unigram entropy, and so does one whose
objective is broken (labels at the wrong positions, a broken attention mask, a head reading the
wrong rows): that curve cannot tell them apart. Here every token is fixed by its neighbours, so only
a model that reads its context beats the best context-free guess, and the gap shows at once.

The language ("cycle languages"): `families` x `languages` disjoint sets of `tokens_per_language`
ordinary tokens, each ordered in a fixed random cycle (`cycles`, drawn from `seed`). A document
belongs to one family and walks its languages' cycles with one counter: token t is
`cycles[lang][(start + t) % tokens_per_language]`, where sentence j of the document speaks the
family's language (first + j) % languages. Inside a sentence a token is
its left neighbour's successor in the cycle (and its right neighbour's predecessor); at a sentence
boundary the language steps on by one and the counter goes on. So sentence B continues sentence A
by a rule: the next language, the next place in the cycle. NSP's random B (another document) and
SOP's swapped order break it, which a model sees only by comparing the two segments (NSP's B is
also of another family half of the time).

Ids 0-4 are [PAD], [UNK], [CLS], [SEP], [MASK]; every ordinary token is a whole word.
Documents are generated on demand from (corpus seed, document seed, index): nothing is stored.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import numpy as np

from bertjax.data.masking import SpecialIds
from bertjax.core.errors import UserError

NUM_SPECIAL = 5
TRAIN_DOCUMENTS = 100_000  # generated on demand; more than a short run reads once
# Keeps document seeds apart from the language's own seed.
_DOC_TAG = 0x444F43


@dataclasses.dataclass(frozen=True)
class CycleLanguage:
  """The language: which token follows which. `vocab_size` = 5 specials + all ordinary tokens."""
  families: int = 1
  languages: int = 4             # per family
  tokens_per_language: int = 8
  seed: int = 0

  def __post_init__(self):
    if self.families < 1 or self.languages < 1 or self.tokens_per_language < 3:
      raise UserError(f"cycle languages need >= 1 family of >= 1 language of >= 3 tokens, got "
                      f"families={self.families}, languages={self.languages}, "
                      f"tokens_per_language={self.tokens_per_language}")

  @property
  def vocab_size(self) -> int:
    return NUM_SPECIAL + self.families * self.languages * self.tokens_per_language

  @property
  def cycles(self) -> np.ndarray:
    """<int32>[families * languages, tokens_per_language]: each language's tokens in their cycle's
    order (family f holds languages f * languages ...)."""
    rng = np.random.default_rng([self.seed, self.families, self.languages, self.tokens_per_language])
    first = NUM_SPECIAL + self.tokens_per_language * np.arange(self.families * self.languages)
    return np.stack([f + rng.permutation(self.tokens_per_language) for f in first]).astype(np.int32)

  def special_ids(self) -> SpecialIds:
    return SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4, vocab_size=self.vocab_size)

  def word_start_mask(self) -> np.ndarray:
    """<bool>[vocab]: every token is a word of its own."""
    return np.ones(self.vocab_size, bool)


class CycleDocuments(Sequence):
  """`num_documents` documents of `language`, each a list of `<int32>[len]` sentences: document i
  is drawn from [language seed, `seed`, i] alone, so any slice can be read in any order."""

  def __init__(self, language: CycleLanguage, num_documents: int, seed: int,
               sentences: tuple[int, int] = (3, 8), sentence_length: tuple[int, int] = (4, 12)):
    self.language, self.num_documents, self.seed = language, num_documents, seed
    self.sentences, self.sentence_length = sentences, sentence_length
    self._cycles = language.cycles

  def __len__(self) -> int:
    return self.num_documents

  def __getitem__(self, i: int) -> list[np.ndarray]:
    if not 0 <= i < self.num_documents:
      raise IndexError(i)
    lang = self.language
    rng = np.random.default_rng([lang.seed, self.seed, int(i), _DOC_TAG])
    n = int(rng.integers(self.sentences[0], self.sentences[1] + 1))
    lengths = rng.integers(self.sentence_length[0], self.sentence_length[1] + 1, size=n)
    family = int(rng.integers(lang.families))
    first, start = int(rng.integers(lang.languages)), int(rng.integers(lang.tokens_per_language))
    ends = np.cumsum(lengths)
    counter = start + np.arange(ends[-1])
    sentence = np.searchsorted(ends, np.arange(ends[-1]), side="right")
    language = family * lang.languages + (first + sentence) % lang.languages
    walk = self._cycles[language, counter % lang.tokens_per_language]
    return np.split(walk, ends[:-1])


def context_free_accuracy(batches: Iterable[dict]) -> float:
  """The accuracy bound of any masked-token predictor that ignores context, on these batches.

  Such a predictor sees only the input token at a masked position ([MASK], or the token itself
  or a random one under 80/10/10). The best function of that token alone picks, for each input
  token, its most frequent label; its accuracy on the same batches (an oracle, so an upper
  bound) is sum over input tokens of that label's count, over all weighted predictions.
  """
  inputs, labels = [], []
  for b in batches:
    seen = np.take_along_axis(np.asarray(b["input_ids"]), np.asarray(b["masked_positions"]), 1)
    real = np.asarray(b["masked_weights"]) > 0
    inputs.append(seen[real])
    labels.append(np.asarray(b["masked_ids"])[real])
  x, y = np.concatenate(inputs), np.concatenate(labels)
  if not len(x):
    raise UserError("no masked predictions in the batches; check the masking settings")
  pairs, counts = np.unique(np.stack([x, y]), axis=1, return_counts=True)
  best = {}
  for seen_token, count in zip(pairs[0], counts):
    best[seen_token] = max(best.get(seen_token, 0), int(count))
  return sum(best.values()) / len(x)


def majority_fraction(labels: np.ndarray) -> float:
  """The accuracy of always answering the most frequent label (chance for NSP/SOP)."""
  labels = np.asarray(labels).ravel()
  return float(np.bincount(labels).max() / len(labels))
