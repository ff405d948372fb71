"""launch.py's command line: absl flags with ml_collections' config_flags for `--config`, the
`--config.key=value` overrides typed as before, and every mistake one line."""

import os
import pathlib
import subprocess
import sys

import pytest
from ml_collections import config_flags

from bertjax.config import config_checks, config_lib
from bertjax.core.errors import UserError

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
import launch  # pylint: disable=wrong-import-position


def test_config_flag_is_config_flags_and_resolves_as_config_lib(tmp_path):
  spec = "configs/bert.py:runlocal"
  argv = ["--config", spec, "--workdir", str(tmp_path), "--config.total_steps=3",
          "--config.learning_rate=1", "--config.data.synthetic=True"]
  fv = launch.define_flags(["launch.py", "--config", spec, "--workdir", str(tmp_path)])
  fv(["launch.py", "--config", spec, "--workdir", str(tmp_path)])
  assert config_flags.get_config_filename(fv["config"]) == spec
  args, overrides = launch.parse_args(argv)
  assert args.workdir == str(tmp_path) and args.sweep is None and not args.dry_run
  assert overrides == argv[4:]
  config_lib.apply_overrides(args.config, overrides)
  before = config_lib.load_config_file(spec)  # the loader launch.py used before absl
  config_lib.apply_overrides(before, overrides)
  assert args.config.is_locked
  assert args.config.to_dict() == before.to_dict()
  assert args.config.total_steps == 3 and args.config.learning_rate == 1.0
  assert isinstance(args.config.learning_rate, float)


def test_variant_after_the_colon_reaches_get_config(tmp_path):
  args, _ = launch.parse_args(["--config=configs/glue.py:task=rte,runlocal",
                               f"--workdir={tmp_path}"])
  assert args.config.to_dict() == config_lib.load_config_file(
      "configs/glue.py:task=rte,runlocal").to_dict()
  args, _ = launch.parse_args(["--config", "configs/bert.py", "--workdir", str(tmp_path)])
  assert args.config.to_dict() == config_lib.load_config_file("configs/bert.py").to_dict()


def _one_line(argv) -> str:
  with pytest.raises(UserError) as e:
    args, overrides = launch.parse_args(argv)
    config_lib.apply_overrides(args.config, overrides)
  message = str(e.value)
  assert "\n" not in message and "Traceback" not in message
  return message


def test_mistakes_are_one_line(tmp_path):
  base = ["--config", "configs/bert.py:runlocal", "--workdir", str(tmp_path)]
  assert "unknown config key 'total_stepz'; did you mean total_steps?" in _one_line(
      [*base, "--config.total_stepz=3"])
  assert "tokenizer" in _one_line([*base, "--config.data.tokenzer=x"])
  assert "--config.total_steps='abc' is not a valid int" in _one_line(
      [*base, "--config.total_steps=abc"])
  assert "must be True or False" in _one_line([*base, "--config.data.synthetic=1"])
  assert "Did you mean: workdir" in _one_line([*base, "--workdr", "x"])
  assert "--dry_run" in _one_line([*base, "--dry_run=maybe"])
  assert "unrecognized arguments: extra" in _one_line([*base, "extra"])
  assert "--workdir" in _one_line(["--config", "configs/bert.py"])
  assert "configs/nope.py not found" in _one_line(["--config", "configs/nope.py", *base[2:]])
  assert "drop --config" in _one_line([*base, "--sweep", "experiments/quickstart_sweep.py"])


def test_config_file_mistakes_are_config_lib_lines(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("def get_config(arg=None):\n  return (\n")
  assert f"{bad}:2:" in _one_line(["--config", str(bad), "--workdir", str(tmp_path)])
  empty = tmp_path / "empty.py"
  empty.write_text("x = 1\n")
  assert "defines no get_config" in _one_line(["--config", str(empty), "--workdir", str(tmp_path)])
  buggy = tmp_path / "buggy.py"
  buggy.write_text("def get_config(arg=None):\n  return int('x')\n")
  with pytest.raises(RuntimeError) as e:  # a bug, not a flag error: its traceback is kept
    launch.parse_args(["--config", str(buggy), "--workdir", str(tmp_path)])
  assert isinstance(e.value.__cause__, ValueError)


def test_sweep_takes_overrides_without_config(tmp_path):
  args, overrides = launch.parse_args(["--sweep", "experiments/quickstart_sweep.py", "--workdir",
                                       str(tmp_path), "--dry_run", "--config.total_steps=2"])
  assert args.config is None and args.dry_run and overrides == ["--config.total_steps=2"]


def test_flagfile_carries_config_and_overrides(tmp_path):
  flagfile = tmp_path / "run.flags"
  flagfile.write_text("--config=configs/bert.py:runlocal\n--config.total_steps=3\n")
  args, overrides = launch.parse_args([f"--flagfile={flagfile}", "--workdir", str(tmp_path)])
  assert overrides == ["--config.total_steps=3"]
  assert args.config.to_dict() == config_lib.load_config_file("configs/bert.py:runlocal").to_dict()
  assert "Unable to open flagfile" in _one_line([f"--flagfile={tmp_path / 'nope'}"])


@pytest.mark.parametrize("flag", ["--help", "--helpfull"])
def test_help(flag, capsys):
  with pytest.raises(SystemExit) as e:
    launch.parse_args([flag])
  assert e.value.code == 0
  text = capsys.readouterr().out
  assert text.startswith("usage: python launch.py --config configs/<exp>.py[:variant]")
  for name in ("--config:", "--workdir:", "--sweep:", "--[no]dry_run:", "--hosts:"):
    assert name in text


def test_flag_error_through_the_command_is_one_line(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "launch.py", "--config", "configs/bert.py:runlocal",
                      "--workdr", str(tmp_path / "w")], cwd=REPO, env=env, capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
  errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "Did you mean: workdir" in errors[0], r.stderr[-2000:]


def test_evals_is_set_from_the_command_line(tmp_path):
  """config.evals (a declared setting) takes a Python/JSON list on the command line, its entries
  written as dicts or as a config file writes them, dict(name=..., every=...); the settings
  checks then read it as from a config file. A bare name is one line saying how to write it."""
  base = ["--config", "configs/quickstart.py:runlocal", "--workdir", str(tmp_path)]
  expected = [{"name": "metric_sums", "every": 2},
              {"name": "glue_probe", "every": 5, "task": "rte"}]
  for text in ('[{"name": "metric_sums", "every": 2}, '
               '{"name": "glue_probe", "every": 5, "task": "rte"}]',
               '[dict(name="metric_sums", every=2), dict(name="glue_probe", every=5, task="rte")]'):
    args, overrides = launch.parse_args([*base, f"--config.evals={text}"])
    config_lib.apply_overrides(args.config, overrides)
    assert [dict(e) for e in args.config.evals] == expected
    config_checks.check_evals(args.config)
  args, overrides = launch.parse_args([*base, '--config.evals=[dict(name="mlm_probe", every=5)]'])
  config_lib.apply_overrides(args.config, overrides)
  with pytest.raises(UserError, match=r"^evals\[0\].name='mlm_probe' is not an evaluator"):
    config_checks.check_evals(args.config)
  # README's command parses as written (the shell's quotes removed).
  readme = (REPO / "README.md").read_text()
  flag = next(l.strip() for l in readme.splitlines() if l.strip().startswith("--config.evals="))
  args, overrides = launch.parse_args([*base, flag.replace("'", "")])
  config_lib.apply_overrides(args.config, overrides)
  assert [e["name"] for e in args.config.evals] == ["metric_sums", "glue_probe"]
  config_checks.check_evals(args.config)
  assert _one_line([*base, "--config.evals=metric_sums"]) == (
      "--config.evals='metric_sums' is not a Python list literal; fix: quote one for the shell, "
      "e.g. --config.evals='[...]' with entries dict(name=\"metric_sums\", every=1000)")


def test_dry_run_checks_one_run_and_writes_nothing(tmp_path):
  """`launch.py --config ... --dry_run` checks the settings, builds the inputs (synthetic here)
  and compiles the step against the device's memory, exits 0 with one line saying so, and the
  workdir is never made; a setting that cannot run is its one-line error, exit 2. Two launch.py
  processes (a tiny BERT compiled once)."""
  workdir = tmp_path / "run"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  base = [sys.executable, "launch.py", "--config", "configs/bert.py:runlocal", "--workdir",
          str(workdir), "--dry_run", "--config.data.synthetic=True", "--config.total_steps=7"]
  r = subprocess.run(base, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  lines = [l for l in r.stdout.splitlines() if l.startswith("dry run:")]
  assert len(lines) == 1 and lines[0].startswith(
      "dry run: settings checked, inputs built (7 steps of ") and lines[0].endswith(
          f"); nothing written to {workdir}"), r.stdout
  assert "the train step compiled on 1 cpu device(s)" in lines[0]
  assert not workdir.exists()
  r = subprocess.run(base + ["--config.batch_size=7", "--config.grad_accum_steps=2"], cwd=REPO,
                     env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
  assert len([l for l in r.stderr.splitlines() if l.startswith("error:")]) == 1, r.stderr
  assert not workdir.exists()
