"""Ragged synthetic rows (bertjax/data/ragged.py, `benchmark --lengths`): lengths drawn from the
named distribution, the pipeline's rows padded or packed with every instance once, and the
benchmark's real-token count the sum of the rows' lengths."""

import numpy as np
import pytest

from bertjax.config import config_lib
from bertjax.core.errors import UserError
from bertjax.data import instances, ragged
from bertjax.models.embeddings import position_ids_for
from bertjax.models.presets import preset
from bertjax.registry import get_objective
from bertjax.tools import benchmark

VOCAB = 60


def config(seq: int, batch: int, pack: bool, objective: str = "mlm", predictions: int = 8):
  """The benchmark's config for modernbert-tiny at these shapes (as `build_config` makes it)."""
  args = benchmark.parse_args(["--preset", "modernbert-tiny", "--seq_len", str(seq),
                               "--batch_size", str(batch), "--objective", objective,
                               "--override", f"max_predictions_per_seq={predictions}",
                               "--override", f"model.vocab_size={VOCAB}",
                               "--override", "model.pad_token_id=0"])
  c = benchmark.build_config(args)
  config_lib.apply_overrides(c, [f"data.pack={pack}", "data.pack_bins=4"])
  return c


def batches(c, lengths, n, seed=0):
  it = ragged.ragged_batches(c, get_objective(c), lengths, VOCAB, seed, c.batch_size)
  return [next(it) for _ in range(n)]


def ks_distance(sample, cdf) -> float:
  """The Kolmogorov-Smirnov distance of an integer sample from a discrete CDF, at its values."""
  values, counts = np.unique(sample, return_counts=True)
  empirical = np.cumsum(counts) / len(sample)
  return float(np.max(np.abs(empirical - cdf(values))))


def test_named_wikitext_lengths_are_the_shipped_samples_measurement():
  """The histograms in the module are what `measure_wikitext` gives on the shipped sample, with
  the runlocal recipes' vocabulary."""
  from configs.common import LOCAL_VOCAB, SAMPLE  # pylint: disable=import-outside-toplevel
  assert ragged.LOCAL_VOCAB == LOCAL_VOCAB
  paragraphs, articles = ragged.measure_wikitext(str(SAMPLE))
  assert paragraphs == ragged.WIKITEXT2_PARAGRAPHS
  assert articles == list(ragged.WIKITEXT2_ARTICLES)
  mean, _ = ragged.parse("wikitext2").moments()
  assert sum(ragged.WIKITEXT2_PARAGRAPHS.values()) == 2185 and mean == pytest.approx(169.4, abs=0.05)


@pytest.mark.parametrize("spec", ["wikitext2", "ragged:300,16"])
def test_sampled_document_lengths_follow_the_distribution(spec):
  lengths = ragged.parse(spec)
  sample = ragged.RaggedDocuments(lengths, VOCAB, seed=3, num_documents=20_000)
  drawn = np.array([sample.length(i) for i in range(len(sample))])
  assert all(len(sample[i][0]) + 2 == drawn[i] for i in range(50))  # [CLS] text [SEP]
  mean, std = lengths.moments()
  assert abs(drawn.mean() - mean) < 4 * std / np.sqrt(len(drawn))
  assert abs(drawn.std() - std) < 0.05 * std
  if lengths.values:
    values, weights = np.asarray(lengths.values), np.asarray(lengths.weights)
    cdf = lambda x: np.cumsum(weights)[np.searchsorted(values, x)]
  else:
    assert drawn.min() >= 16 and mean == 300
    p = 1 / (mean - 16 + 1)
    cdf = lambda x: 1 - (1 - p) ** (x - 16 + 1)
  assert ks_distance(drawn, cdf) < 1.95 / np.sqrt(len(drawn))  # KS at 0.1%


@pytest.mark.parametrize("spec,message", [
    ("wikitext3", "use full, wikitext2"), ("ragged:300", "ragged:MEAN,MIN"),
    ("ragged:300,2", "MIN must be at least 3"), ("ragged:10,16", "MEAN at least MIN")])
def test_a_bad_distribution_is_one_line(spec, message):
  with pytest.raises(UserError, match=message) as e:
    ragged.parse(spec)
  assert "\n" not in str(e.value)


def test_documents_are_cut_into_rows_as_the_pipeline_cuts_them():
  assert ragged.row_lengths([10, 64, 65, 2 + 62 * 2 + 5], 64) == [10, 64, 64, 3, 64, 64, 7]


def test_padded_rows_have_the_documents_lengths_in_the_epochs_order():
  """Padded: one instance per row, in the pipeline's document order, each cut at seq; over many
  rows the lengths follow the distribution (seq 1024: no paragraph is cut)."""
  c = config(seq=64, batch=8, pack=False)
  got = batches(c, ragged.parse("wikitext2"), 6)
  assert all("segment_ids" not in b and b["input_ids"].shape == (8, 64) for b in got)
  docs = ragged.RaggedDocuments(ragged.parse("wikitext2"), VOCAB, 0)
  order = instances.shard_documents(len(docs), 0, 0)
  want = ragged.row_lengths([docs.length(i) for i in order[:48]], 64)[:48]
  np.testing.assert_array_equal(np.concatenate([b["attention_mask"].sum(1) for b in got]), want)
  c = config(seq=1024, batch=16, pack=False, predictions=4)
  lengths = ragged.parse("wikitext2")
  rows = np.concatenate([b["attention_mask"].sum(1) for b in batches(c, lengths, 40)])
  values, weights = np.asarray(lengths.values), np.asarray(lengths.weights)
  assert ks_distance(rows, lambda x: np.cumsum(weights)[np.searchsorted(values, x)]) < \
      1.95 / np.sqrt(len(rows))


def test_packed_rows_hold_every_instance_once_with_their_segment_ids_and_positions():
  """Packed (4 bins, batches of 4 rows: one first-fit group per batch): the instances of the
  padded stream, each exactly once, as contiguous segments 1..k with positions from 0."""
  lengths = ragged.parse("ragged:20,4")
  padded = batches(config(seq=48, batch=4, pack=False), lengths, 60)
  packed = batches(config(seq=48, batch=4, pack=True), lengths, 6)

  def unmasked(b):  # the rows' tokens before masking
    ids = b["input_ids"].copy()
    rows, slots = np.nonzero(b["masked_weights"])
    ids[rows, b["masked_positions"][rows, slots]] = b["masked_ids"][rows, slots]
    return ids

  cfg = preset("modernbert-tiny")
  pieces = []
  for b in packed:
    ids, seg = unmasked(b), b["segment_ids"]
    np.testing.assert_array_equal(seg > 0, b["attention_mask"] == 1)
    positions = np.asarray(position_ids_for(cfg, ids, seg))
    for r in range(len(ids)):
      k, real = seg[r].max(), int((seg[r] > 0).sum())
      # 1..k in order, each a contiguous run, then padding (0) to the row's end.
      assert seg[r, 0] == 1 and np.all(seg[r, :real] > 0) and np.all(seg[r, real:] == 0)
      assert set(np.diff(seg[r, :real])) <= {0, 1} and len(set(seg[r, :real])) == k
      for s in range(1, k + 1):
        at = np.nonzero(seg[r] == s)[0]
        np.testing.assert_array_equal(positions[r, at], np.arange(len(at)))
        pieces.append(tuple(ids[r, at]))
  stream = [tuple(row[:n]) for b in padded for row, n in
            zip(unmasked(b), b["attention_mask"].sum(1))]
  assert sorted(pieces) == sorted(stream[:len(pieces)])  # each once, none skipped
  assert len(pieces) > 1.5 * len(packed) * 4  # several per row


def test_packing_a_pair_objective_is_refused_in_one_line():
  with pytest.raises(UserError, match="objective 'mlm_nsp' reads a sentence-pair label") as e:
    batches(config(seq=32, batch=2, pack=True, objective="mlm_nsp"), ragged.parse("wikitext2"), 1)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("flags,message", [
    (["--pack"], "give --lengths too"), (["--lengths", "ragged:1"], "ragged:MEAN,MIN"),
    (["--lengths", "wikitext2", "--pack", "--objective", "mlm_nsp"], "sentence-pair label")])
def test_benchmark_refuses_bad_row_flags_before_building_anything(flags, message):
  with pytest.raises(UserError, match=message):
    benchmark.main(["--preset", "bert-tiny", "--steps", "1", *flags])


def test_benchmark_counts_the_real_tokens_of_its_batches():
  """--lengths with --pack: the result's real tokens per batch are the rows' lengths summed (the
  same batches built again), its rate their mean over the timed steps per step time."""
  flags = ["--preset", "modernbert-tiny", "--batch_size", "4", "--seq_len", "32", "--steps", "3",
           "--override", "max_predictions_per_seq=4", "--override", "model.vocab_size=60",
           "--override", "model.pad_token_id=0",
           "--lengths", "ragged:20,4"]
  result = benchmark.main(flags + ["--pack"])
  c = benchmark.build_config(benchmark.parse_args(flags + ["--pack"]))
  it = ragged.ragged_batches(c, get_objective(c), ragged.parse("ragged:20,4"), 60, c.seed, 4)
  again = [next(it) for _ in range(3)]
  assert result["packed"] and result["lengths"] == "ragged:20,4"
  assert result["batch_real_tokens"] == [int((b["segment_ids"] > 0).sum()) for b in again]
  per_step = np.mean(result["batch_real_tokens"])  # 3 steps over 3 batches
  assert result["real_tokens_per_step"] == pytest.approx(per_step)
  assert result["real_tokens_per_s"] == pytest.approx(per_step / result["step_time_s"])
  assert result["slots_per_step"] == 4 * 32 and result["tokens_per_s"] == pytest.approx(
      128 / result["step_time_s"])
  assert result["fill"] == pytest.approx(per_step / 128) and result["fill"] > 0.8
