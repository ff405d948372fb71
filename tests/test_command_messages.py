"""What the commands say: warnings where a setting defeats the task, one line where one is due,
paths and help texts that read whole, and docstrings that agree with the code they describe."""

from __future__ import annotations

import ast
import io
import logging
import re

import pytest
import transformers as T
from absl import flags

import launch
from bertjax import convert
from bertjax.config import config_lib
from bertjax.core.errors import UserError
from bertjax.convert import __main__ as convert_cli
from bertjax.data import prepare, tokenizers
from bertjax.data.tokenizers import __main__ as tokenizers_cli
from bertjax.metrics import ner as ner_eval
from bertjax.prune import __main__ as prune_cli
from bertjax.registry import get_objective
from bertjax.tools import benchmark, embed as embed_cli, evaluate as evaluate_cli, report
from bertjax.tools import compile as compile_tool
from bertjax.tools import multihost, tpu_lowering
from bertjax.trainer import train
from conftest import REPO
from helpers import TINY, load_config
from test_train import tiny_config


# ----------------------------------------------------------------------------- warnings, lines


@pytest.mark.slow
@pytest.mark.parametrize("lowercase", [True, False])
def test_ner_from_an_uncased_tokenizer_warns(tmp_path, data_dir, caplog, lowercase):
  sentences = ner_eval.read_conll(data_dir / "conll2003/valid.txt")[:40]
  tok = tokenizers.train_sentencepiece((" ".join(s.tokens) for s in sentences), tmp_path / "tok",
                                       vocab_size=150, lowercase=lowercase, num_threads=1)
  assert tok.lowercase == lowercase
  conll = data_dir / "conll2003" / "valid.txt"
  config = load_config("configs/ner.py:runlocal", **{
      **TINY, "data_dir": str(conll.parent), "train_file": "valid.txt", "dev_file": "valid.txt",
      "test_file": "", "max_train_examples": 20, "data.tokenizer": str(tmp_path / "tok"),
      "model.vocab_size": 150})
  with caplog.at_level(logging.WARNING):
    get_objective(config).prepare(config, tmp_path / "w")
  warned = [r.getMessage() for r in caplog.records if "NER needs a cased" in r.getMessage()]
  assert len(warned) == (1 if lowercase else 0), caplog.text


@pytest.mark.slow
def test_from_hf_lists_only_the_heads_it_read(tmp_path):
  config = T.BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=37)
  T.BertModel(config).save_pretrained(tmp_path / "b")
  lines = []
  convert.convert_from_hf(tmp_path / "b", tmp_path / "w", log=lines.append)
  assert "(heads: none)" in lines[0], lines
  assert "missing heads, initialized fresh: mlm, pair" in lines


@pytest.mark.slow
def test_init_from_is_reported_once(tmp_path, capsys):
  """With logging set up as launch.py sets it up, the init_from line shows once (log or stdout)."""
  train.train_and_evaluate(tiny_config(total_steps=1, eval_every=0), tmp_path / "a")
  stream = io.StringIO()
  handler = logging.StreamHandler(stream)
  root = logging.getLogger()
  level = root.level
  root.addHandler(handler)
  root.setLevel(logging.INFO)
  try:
    train.train_and_evaluate(tiny_config(total_steps=1, eval_every=0,
                                         init_from=str(tmp_path / "a")), tmp_path / "b")
  finally:
    root.removeHandler(handler)
    root.setLevel(level)
  shown = stream.getvalue() + capsys.readouterr().out
  assert len(re.findall(r"init_from \S+: restored", shown)) == 1, shown


def test_the_end_table_names_absolute_paths(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  where = tmp_path / "run"
  summary = {"workdir": "run", "status": "finished", "step": 2, "first_train": {"loss": 2.0},
             "first_train_step": 1, "checkpoint": str(where / "checkpoints" / "2")}
  lines = launch.end_lines(summary, "run").splitlines()
  assert lines[0] == f"run finished at step 2: {where}"
  assert lines[-2] == f"checkpoint: {where / 'checkpoints' / '2'}"
  assert lines[-1] == f"summary: {where / 'summary.json'} (every row: metrics.jsonl)"
  assert launch.end_lines({}, "run") == f"summary: {where / 'seeds_summary.json'}"


# ----------------------------------------------------------------------------- --help texts

HELPS = [(launch.parse_args, ["--help"]), (benchmark.parse_args, ["--help"]),
         (report.main, ["--help"]), (prune_cli.main, ["--help"]), (embed_cli.main, ["--help"]),
         (evaluate_cli.main, ["--help"]), (prepare.main, ["--help"]),
         (convert_cli.main, ["--help"]), (convert_cli.main, ["from-hf", "--help"]),
         (convert_cli.main, ["to-hf", "--help"])]
DANGLING = {"a", "an", "the", "of", "by", "to", "with", "and", "or", "after", "each", "side"}


@pytest.mark.parametrize("command, argv", HELPS, ids=lambda x: getattr(x, "__module__", None))
def test_help_reads_whole(command, argv, capsys, monkeypatch):
  monkeypatch.setenv("COLUMNS", "100")
  with pytest.raises(SystemExit):
    command(argv)
  text = capsys.readouterr().out
  assert "non-empty" not in text, text
  paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
  if not paragraphs[1].startswith(("options:", "positional arguments:")):
    assert paragraphs[1].endswith((".", ".)")), paragraphs[1]  # the description, whole


@pytest.mark.parametrize("parser", [prune_cli._parser, prepare._parser])
def test_option_helps_end_on_a_word_that_ends(parser):
  for action in parser()._actions:
    if action.help:
      assert action.help.split()[-1].lower() not in DANGLING, (action.option_strings, action.help)


ABSL_FLAGS = [embed_cli.define_flags, evaluate_cli.define_flags, report.define_flags,
              multihost.define_flags, tokenizers_cli._train_flags, convert_cli._from_hf_flags,
              convert_cli._to_hf_flags]


@pytest.mark.parametrize("define", ABSL_FLAGS, ids=lambda f: f.__module__)
def test_flag_helps_end_on_a_word_that_ends(define):
  """The same for the tools on absl flags (bertjax/core/command_line.py)."""
  fv = flags.FlagValues()
  define(fv)
  for name in fv:
    assert fv[name].help.split()[-1].lower() not in DANGLING, (name, fv[name].help)


@pytest.mark.parametrize("command, argv", [
    (convert_cli.main, ["to-hf", "--workdir", "w"]), (convert_cli.main, ["from-hf", "--part=x"]),
    (convert_cli.main, ["export"]), (tokenizers_cli.main, ["train", "--input=a", "--output=b",
                                                           "--vocab_size=many"]),
    (evaluate_cli.main, ["glu", "--data=a", "--predictions=b"]), (report.main, []),
    (report.main, ["a", "b"]), (embed_cli.main, ["--workdir=w", "--output=o.npz"]),
    (multihost.main, ["--processes=0", "--", "x.py"]), (multihost.main, ["x.py"]),
    (tpu_lowering.main, ["--mesh=2,2"]), (tpu_lowering.main, ["--config=configs/none.py"]),
    (compile_tool.main, ["--target=v5e-4"]), (compile_tool.main, ["--config=configs/none.py"]),
    (report.main, ["a", "--metrc=loss"]),
])
def test_absl_usage_mistakes_are_one_line(command, argv):
  """A usage mistake of a tool on absl flags: one line naming the flag (or the argument) and
  `--help`, no traceback (a UserError: exit 2 through run_cli)."""
  with pytest.raises(UserError) as e:
    command(argv)
  text = str(e.value)
  assert "\n" not in text and ("--help" in text or "not found" in text), text


# ----------------------------------------------------------------------------- docstrings


def _docstring(path: str) -> str:
  return ast.get_docstring(ast.parse((REPO / path).read_text()))


def test_quickstart_sweep_runs_the_rate_its_docstring_names():
  named = float(re.search(r"the variant's own (\S+?)\s", _docstring(
      "experiments/quickstart_sweep.py")).group(1))
  base = config_lib.load_config_file(str(REPO / "configs/quickstart.py") + ":runlocal")
  assert named == base.learning_rate
  sweep = {}
  exec(compile((REPO / "experiments/quickstart_sweep.py").read_text(), "sweep", "exec"), sweep)
  rates = sweep["get_sweep"]()["product"]["learning_rate"]
  assert rates == [named, 3 * named]


def test_distill_docstring_names_the_setting_the_teacher_sets():
  source = (REPO / "bertjax/objectives/teacher.py").read_text()
  flags = re.findall(r"jax\.config\.update\(\"(\w+)\"", source)
  assert flags
  doc = _docstring("configs/distill.py")
  for flag in flags:
    assert flag in doc
  assert "The environment variable" not in doc


# ----------------------------------------------------------------------------- first-use mistakes


def test_benchmark_profile_into_a_file_is_refused_before_the_timing(tmp_path):
  """ea9bcfe timed the step first, then `FileExistsError` with a traceback (status 1) when
  --profile named a file."""
  file = tmp_path / "ops"
  file.write_text("notes\n")
  with pytest.raises(UserError) as e:
    benchmark.parse_args(["--preset", "bert-tiny", "--profile", str(file)])
  assert str(e.value) == (f"--profile {file} is a file, not a folder; fix: pass a folder to "
                          "--profile")
  assert file.read_text() == "notes\n"


@pytest.mark.parametrize("argv, message", [
    (["--override", "learning_rate"],
     "--override 'learning_rate' has no value; write --override learning_rate=VALUE"),
    (["--dropout", "1.5"], "--dropout 1.5 must be in [0, 1) (a dropout probability); fix: "
                           "--dropout 0.1"),
    (["--override", "learning_rate=abc"],
     "--override learning_rate='abc' is not a valid float; give a value like 0.0001"),
    (["--override", "batch_size=0"], "batch_size=0 must be >= 1 (rows per optimizer step (all "
                                     "hosts, all micro-batches)); fix: --override batch_size=32"),
])
def test_benchmark_mistakes_name_its_own_flags(argv, message):
  """ea9bcfe's lines told the benchmark's user to write --config.KEY=VALUE (launch.py's flag,
  which this command refuses) for a bare --override, a --dropout out of range or a refused
  setting."""
  with pytest.raises(UserError) as e:
    benchmark.build_config(benchmark.parse_args(["--preset", "bert-tiny", *argv]))
  assert str(e.value) == message
  assert "--config." not in str(e.value)


@pytest.mark.parametrize("argv, objective", [
    (["--config", "configs/glue.py:task=rte,runlocal"], "glue"),
    (["--config", "configs/squad.py:runlocal"], "squad"),
    (["--preset", "bert-tiny", "--objective", "ner"], "ner"),
])
def test_benchmark_of_a_fine_tuning_config_is_one_line(argv, objective):
  """ea9bcfe compiled a GLUE, SQuAD or CoNLL step on synthetic batches that lack its keys:
  `KeyError: 'weight'` with a traceback (status 1); `--objective glue` asked for a task."""
  with pytest.raises(UserError) as e:
    benchmark.build_config(benchmark.parse_args(argv))
  assert str(e.value) == (f"objective {objective!r} is a fine-tuning task; the benchmark times "
                          "pretraining objectives on synthetic batches: pass a pretraining "
                          "config or --objective (e.g. --config configs/bert.py:runlocal, or "
                          "--objective mlm)")
