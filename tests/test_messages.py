"""Messages a user can cause, made true and short: a syntax error in a config or sweep file, a
folder where a file is wanted (embed, evaluate, bertjax.load), a bad model.json value, the file a
mismatch is blamed on, prune without checkpoints, the corpus-too-small flag, benchmark's
--batch_size 0, and embed's output mode. Each is one line (a UserError), never a traceback."""

import argparse
import json
import os
import pathlib

import numpy as np
from orbax import checkpoint as ocp
import pytest

import bertjax
from bertjax import inputs, sweep
from bertjax.config import config_lib
from bertjax.core.errors import UserError
from bertjax.prune import __main__ as prune_main
from bertjax.tools import benchmark, embed, evaluate

REPO = pathlib.Path(__file__).resolve().parent.parent
TINY = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 64, "max_position_embeddings": 32}


def one_line(e: pytest.ExceptionInfo) -> str:
  text = str(e.value)
  assert "\n" not in text
  return text


@pytest.mark.parametrize("kind", ["config", "sweep"])
def test_a_syntax_error_names_the_file_and_line(tmp_path, kind):
  """A traceback (SyntaxError from importlib) before; now `FILE:LINE: message`."""
  path = tmp_path / f"bad_{kind}.py"
  path.write_text(f"def get_{kind}(arg=None):\n  return dict(\n")
  load = config_lib.load_config_file if kind == "config" else sweep.load_sweep_spec
  with pytest.raises(UserError) as e:
    load(str(path))
  text = one_line(e)
  assert text.startswith(f"{path}:2: ") and f"syntax error in the {kind} file" in text


def test_embed_output_naming_a_folder_fails_before_any_work(tmp_path):
  """--output FOLDER was taken for an existing output ("pass --overwrite"), then with
  --overwrite failed in os.replace after the features were computed. Now it is refused first:
  before the (missing) workdir is even looked at."""
  folder = tmp_path / "feats.npz"
  folder.mkdir()
  (tmp_path / "in.txt").write_text("a b\n")
  with pytest.raises(UserError) as e:
    embed.main(["--workdir", str(tmp_path / "missing"), "--input", str(tmp_path / "in.txt"),
                "--output", str(folder), "--overwrite"])
  assert "is a folder; name a file" in one_line(e)


def test_embed_output_has_the_mode_of_every_other_output(tmp_path):
  """mkstemp's 0600 before; now 0666 less the umask, as open() gives every other output."""
  umask = os.umask(0o022)
  try:
    embed.write_atomically(tmp_path / "out.npz", {"pooled": np.zeros((2, 4), np.float32)})
    (tmp_path / "plain.txt").write_text("x")
  finally:
    os.umask(umask)
  mode = lambda p: (tmp_path / p).stat().st_mode & 0o777
  assert mode("out.npz") == mode("plain.txt") == 0o644
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz", "plain.txt"]


@pytest.mark.parametrize("flag", ["--predictions", "--data"])
def test_evaluate_names_a_folder_as_a_folder(tmp_path, flag):
  """"file not found" for a folder that exists; now it says it is a folder."""
  gold = tmp_path / "dev.tsv"
  gold.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n")
  args = {"--data": str(gold), "--predictions": str(tmp_path / "RTE.tsv")}
  args[flag] = str(tmp_path)
  with pytest.raises(UserError) as e:
    evaluate.main(["glue", "--task", "rte", *[x for kv in args.items() for x in kv]])
  assert f"{flag} {tmp_path} is a folder, not a file" in one_line(e)


def test_load_calls_an_existing_file_a_file(tmp_path):
  """bertjax.load said an existing file "does not exist"."""
  path = tmp_path / "model.safetensors"
  path.write_bytes(b"x")
  with pytest.raises(UserError) as e:
    bertjax.load(path)
  assert "is a file, not a folder" in one_line(e) and "does not exist" not in str(e.value)


def test_load_names_a_bad_model_json_value(tmp_path):
  """A string hidden_size read as "not all arguments converted during string formatting"."""
  (tmp_path / "model.json").write_text(json.dumps({"model": {**TINY, "hidden_size": "32"},
                                                   "heads": []}))
  with pytest.raises(UserError) as e:
    bertjax.load(tmp_path)
  text = one_line(e)
  assert text.startswith(f"{tmp_path / 'model.json'}: model.hidden_size='32' must be an integer")
  assert "string formatting" not in text


def test_a_run_whose_params_do_not_match_names_config_json(tmp_path):
  """A best/ folder of a training run is described by the run's config.json, not model.json."""
  (tmp_path / "config.json").write_text(json.dumps({"objective": "mlm", "model": TINY}))
  best = tmp_path / "best"
  best.mkdir()
  (best / "best.json").write_text(json.dumps({"step": 3, "metric": "loss", "value": 1.0}))
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(best / "params", {"encoder": {"stray": np.zeros(2, np.float32)}})
  checkpointer.wait_until_finished()
  with pytest.raises(UserError) as e:
    bertjax.load(best)
  assert one_line(e).endswith(f"the params do not match {tmp_path / 'config.json'}")


def test_prune_without_checkpoints_speaks_of_workdir(tmp_path):
  """prune on a folder without checkpoints spoke of an init_from the user never gave."""
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text("{}")
  with pytest.raises(UserError) as e:
    prune_main.main(["--workdir", str(run), "--output", str(tmp_path / "out"),
                     "--target-heads", "0.5"])
  text = one_line(e)
  assert f"--workdir {run} holds no checkpoints/" in text and "init_from" not in text


def test_a_one_line_corpus_names_the_config_flag(tmp_path):
  """The training config's vocabulary is --config.data.vocab_size, not the tokenizer command's
  --vocab_size."""
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("just one short line of text\n")
  config = config_lib.load_module(REPO / "configs" / "common.py").base_config()
  config.data_dir, config.data.corpus, config.data.tokenizer = "", str(corpus), ""
  config.data.vocab_size = 300
  with pytest.raises(UserError) as e:
    inputs.prepared_corpus_dir(config, tmp_path / "work")
  assert "--config.data.vocab_size 300 is larger than this corpus supports" in one_line(e)
  assert "use a smaller --config.data.vocab_size" in str(e.value)


@pytest.mark.parametrize("flag", ["--batch_size", "--seq_len"])
def test_benchmark_refuses_a_zero_size_in_its_own_flag(flag):
  """--batch_size 0 ran the config's 256 without a word; a negative one was refused naming
  --config.batch_size, which the benchmark does not take."""
  for value in ("0", "-2"):
    with pytest.raises(UserError) as e:
      benchmark.parse_args([flag, value])
    text = one_line(e)
    assert text.startswith(f"{flag} {value} must be >= 1") and "--config" not in text
  assert isinstance(benchmark.parse_args([flag, "4"]), argparse.Namespace)
