"""A generated corpus whose words follow from their context: a check that an objective learns more
than unigram statistics.

On natural text a tiny model first falls to the corpus's unigram entropy, and so does one whose
objective is broken (labels at the wrong positions, a broken attention mask, a head reading the
wrong rows): that curve cannot tell them apart. Here every token is fixed by its neighbours, so only
a model that reads its context beats the best context-free guess, and the gap shows at once.

The language ("cycle languages"): `languages` disjoint sets of `tokens_per_language` ordinary
tokens; each set is ordered in a fixed random cycle (one permutation `successor` of the vocabulary,
drawn from `seed`). A document picks a language and a random first token and walks the cycle:
token i+1 is `successor[token i]`, so a masked token is its left neighbour's successor (and its
right neighbour's predecessor). Sentences are consecutive stretches of that walk, so sentence B
continues sentence A exactly where A stopped: NSP's random B (most often another language, else
the wrong place of the cycle) and SOP's swapped order break the rule at the boundary.

Ids 0-4 are [PAD], [UNK], [CLS], [SEP], [MASK]; every ordinary token is a whole word.
Documents are generated on demand from (corpus seed, document seed, index): nothing is stored.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import numpy as np

from bertjax.data.masking import SpecialIds
from bertjax.errors import UserError

NUM_SPECIAL = 5
TRAIN_DOCUMENTS = 100_000  # generated on demand; more than a short run reads once
# Keeps document seeds apart from the language's own seed.
_DOC_TAG = 0x444F43


@dataclasses.dataclass(frozen=True)
class CycleLanguage:
  """The language: which token follows which. `vocab_size` = 5 specials + all ordinary tokens."""
  languages: int = 4
  tokens_per_language: int = 8
  seed: int = 0

  def __post_init__(self):
    if self.languages < 1 or self.tokens_per_language < 3:
      raise UserError(f"a cycle language needs >= 1 language of >= 3 tokens, got languages="
                      f"{self.languages}, tokens_per_language={self.tokens_per_language}")

  @property
  def vocab_size(self) -> int:
    return NUM_SPECIAL + self.languages * self.tokens_per_language

  @property
  def successor(self) -> np.ndarray:
    """<int32>[vocab]: the token that follows each ordinary token (specials map to themselves)."""
    rng = np.random.default_rng([self.seed, self.languages, self.tokens_per_language])
    nxt = np.arange(self.vocab_size, dtype=np.int32)
    for lang in range(self.languages):
      tokens = NUM_SPECIAL + lang * self.tokens_per_language + rng.permutation(
          self.tokens_per_language)
      nxt[tokens] = np.roll(tokens, -1)
    return nxt

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
    self._successor = language.successor

  def __len__(self) -> int:
    return self.num_documents

  def __getitem__(self, i: int) -> list[np.ndarray]:
    if not 0 <= i < self.num_documents:
      raise IndexError(i)
    lang = self.language
    rng = np.random.default_rng([lang.seed, self.seed, int(i), _DOC_TAG])
    n = int(rng.integers(self.sentences[0], self.sentences[1] + 1))
    lengths = rng.integers(self.sentence_length[0], self.sentence_length[1] + 1, size=n)
    token = NUM_SPECIAL + int(rng.integers(lang.languages)) * lang.tokens_per_language + int(
        rng.integers(lang.tokens_per_language))
    walk = np.empty(int(lengths.sum()), np.int32)
    for t in range(len(walk)):
      walk[t] = token
      token = self._successor[token]
    return np.split(walk, np.cumsum(lengths)[:-1])


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
