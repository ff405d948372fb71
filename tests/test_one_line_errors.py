"""One line where a traceback came (issue 41, defects 19 and 22): a malformed
masking.rate_schedule, from-hf with a config.json value of the wrong kind, tools.report on a
read-only sweep folder, and ModernBERT with a sentence-pair objective, refused before a tokenizer
is trained or a corpus prepared. Each was seen failing on dd89774."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from bertjax.config import config_checks, config_lib
from bertjax.core.errors import UserError
from bertjax.trainer import train
from tests.helpers import load_config, run_module
from tests.test_report import entry, write_point, write_sweep_json
from tests.test_train import tiny_config

REPO = pathlib.Path(__file__).resolve().parent.parent


def _one_error_line(r) -> str:
  assert r.returncode == 2, r.stderr[-3000:]
  assert "Traceback" not in r.stderr, r.stderr[-3000:]
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-3000:]
  return lines[0]


@pytest.mark.parametrize("value, needle", [
    ("(5, 0.1)", "masking.rate_schedule=(5, 0.1) must be a tuple of (step, rate) pairs of "
                 "numbers, e.g. ((1000, 0.15), (2000, 0.05)) (one pair needs its own "
                 "parentheses: ((5, 0.1),))"),
    ("((1, 'x'),)", "masking.rate_schedule=((1, 'x'),) must be a tuple of (step, rate) pairs of "
                    "numbers"),
    ("((1, 0.1, 3),)", "must be a tuple of (step, rate) pairs"),
    ("((1.5, 0.1),)", "must be (step, rate) pairs with rising steps >= 0"),
    ("((5, 1.5),)", "rate 1.5 at step 5 must be in (0, 1)"),
])
def test_a_malformed_rate_schedule_is_one_line(value, needle):
  """dd89774: `TypeError: object of type 'int' has no len()` for a bare pair, and `'<' not
  supported between instances of 'float' and 'str'` for a rate written as text."""
  config = tiny_config()
  config_lib.apply_overrides(config, [f"masking.rate_schedule={value}"])
  with pytest.raises(UserError) as e:
    config_checks.check_settings(config)
  assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_well_formed_rate_schedule_passes_as_tuple_or_as_recorded_lists():
  for value in ("((0, 0.3), (100, 0.05))", "[[0, 0.3], [100, 0.05]]"):
    config = tiny_config()
    config_lib.apply_overrides(config, [f"masking.rate_schedule={value}"])
    config_checks.check_settings(config)


@pytest.mark.parametrize("key, value, needle", [
    ("hidden_size", "32", "hidden_size='32' must be an integer"),
    ("num_attention_heads", True, "num_attention_heads=True must be an integer"),
    ("layer_norm_eps", "1e-12", "layer_norm_eps='1e-12' must be a number"),
])
def test_from_hf_with_a_value_of_the_wrong_kind_is_one_line(tmp_path, key, value, needle):
  """dd89774: `TypeError: not all arguments converted during string formatting` (a traceback)
  for "hidden_size": "32". The config is read before the weights, so a config.json alone
  reaches the check."""
  src = tmp_path / "hf"
  src.mkdir()
  (src / "config.json").write_text(json.dumps({"model_type": "bert", key: value}))
  r = run_module("-m", "bertjax.convert", "from-hf", "--model-dir", str(src), "--workdir",
                 str(tmp_path / "out"))
  line = _one_error_line(r)
  assert line == f"error: config.json: {needle}", line
  assert not (tmp_path / "out").exists()


def _read_only_prefix(folder: pathlib.Path) -> list[str]:
  """A command prefix under which `folder` is read-only: a read-only bind mount in a private
  mount namespace (root can write through file modes), or nothing where the modes hold."""
  if os.geteuid() != 0:
    folder.chmod(0o555)
    return []
  script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
  probe = ["unshare", "--mount", "--map-root-user", "sh", "-c", script, str(folder), "true"]
  if not shutil.which("unshare") or subprocess.run(probe, capture_output=True).returncode:
    pytest.skip("root here, and no private mount namespace to make a folder read-only in")
  return probe[:-1]


@pytest.mark.slow
def test_report_on_a_read_only_sweep_folder_is_one_line(tmp_path):
  """dd89774: `OSError: [Errno 30] Read-only file system: '.../.report.md....tmp'` (or
  PermissionError) with a traceback, after reading every point."""
  sweep_dir = tmp_path / "sweep"
  entries = []
  for lr in (1e-3, 3e-3):
    name = f"learning_rate={lr}"
    write_point(sweep_dir, name, {"objective": "mlm", "learning_rate": lr, "seed": 0,
                                  "total_steps": 20, "batch_size": 8}, [9.0, 8.0, 7.0],
                [{"loss": 7.5, "mlm_accuracy": 0.1, "examples": 64}])
    entries.append(entry(name, {"learning_rate": lr}, 20))
  write_sweep_json(sweep_dir, entries)
  before = sorted(p.name for p in sweep_dir.iterdir())
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  r = subprocess.run([*_read_only_prefix(sweep_dir), sys.executable, "-m", "bertjax.tools.report",
                      str(sweep_dir)], cwd=REPO, env=env, capture_output=True, text=True,
                     timeout=300)
  sweep_dir.chmod(0o755)
  line = _one_error_line(r)
  assert line.startswith(f"error: {sweep_dir} is not writable, and the report is written into "
                         "it (report.md, train_loss.png, dev_vs_lr.png); fix: "), line
  assert sorted(p.name for p in sweep_dir.iterdir()) == before


def test_modernbert_with_a_sentence_pair_objective_is_refused_before_any_data(tmp_path):
  """Defect 22: ModernBERT (no token types, no pooler) with mlm_sop or mlm_nsp on raw text.
  dd89774 trained the tokenizer and prepared the corpus first (seen failing there: the workdir
  held tokenizer and corpus when the refusal came); now the run-start checks refuse it and
  nothing is created."""
  corpus = REPO / "bertjax/data/samples/wikitext2_test.raw"
  for objective in ("mlm_sop", "mlm_nsp"):
    # data.kind '' (the objective's own instances) and no packing: what the refusals of
    # ModernBERT's packed 'single' rows for a pair objective tell one to set.
    config = load_config("configs/modernbert.py:runlocal", objective=objective,
                         **{"data.corpus": str(corpus), "data.format": "wikitext",
                            "data.kind": "", "data.pack": False})
    workdir = tmp_path / objective
    with pytest.raises(UserError, match="^ModernBERT has no token types nor pooler, so no "
                                        "NSP/SOP head; use --config.objective=mlm$"):
      train.train_and_evaluate(config, workdir)
    assert not workdir.exists()


@pytest.mark.parametrize("flag, kind", [("--config", "config"), ("--sweep", "sweep")])
def test_a_config_or_sweep_file_that_is_not_python_is_one_line(tmp_path, flag, kind):
  """ea9bcfe ran a .json or .txt given to --config or --sweep as Python: `NameError: name 'x'
  is not defined` (--config) or `AttributeError: 'NoneType' object has no attribute 'loader'`
  (--sweep), each with a traceback and status 1."""
  spec = tmp_path / "settings.json"
  spec.write_text('{"learning_rate": 0.001}\n')
  r = run_module("launch.py", flag, str(spec), "--workdir", str(tmp_path / "run"))
  line = _one_error_line(r)
  assert line == (f"error: {kind} file {spec} is not a Python file (.py): a {kind} file is "
                  f"Python code; fix: pass a .py {kind} file"), line
  assert not (tmp_path / "run").exists()


def test_a_workdir_that_cannot_be_made_is_one_line():
  """ea9bcfe, as root: `FileNotFoundError: [Errno 2] No such file or directory: '/proc/...'`
  with a traceback, as the permission check passes for root where mkdir fails (a read-only
  mount alike). /proc takes no new folder from anyone."""
  if not pathlib.Path("/proc/self").exists():
    pytest.skip("no /proc here")
  workdir = "/proc/bertjax-run"
  with pytest.raises(UserError) as e:
    train.train_and_evaluate(tiny_config(), workdir)
  assert str(e.value).startswith(f"workdir {workdir} cannot be created"), str(e.value)
  assert "fix: pass a --workdir you can write to" in str(e.value)
