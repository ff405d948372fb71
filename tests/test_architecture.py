"""The import layers of .importlinter hold (imports only look down), and breaking them is caught."""

import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())"]


def lint(root: pathlib.Path) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=str(root))
  return subprocess.run(LINT + ["--config", str(root / ".importlinter"), "--no-cache"], cwd=root,
                        env=env, capture_output=True, text=True, timeout=300)


def test_imports_only_look_down():
  r = lint(REPO)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
  assert "Imports only look down KEPT" in r.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
  """A model module importing the trainer (a lower layer looking up) fails the check."""
  shutil.copytree(REPO / "bertjax", tmp_path / "bertjax",
                  ignore=shutil.ignore_patterns("__pycache__", "samples"))
  shutil.copy(REPO / ".importlinter", tmp_path / ".importlinter")
  heads = tmp_path / "bertjax" / "models" / "heads.py"
  heads.write_text(heads.read_text() + "\nfrom bertjax import train  # an upward import\n")
  r = lint(tmp_path)
  assert r.returncode != 0
  assert "bertjax.models is not allowed to import bertjax.train" in r.stdout, r.stdout[-3000:]


def test_every_registered_objective_is_named_as_its_key():
  from bertjax.objective import Objective
  from bertjax.registry import REGISTERED, objective_class
  for name in REGISTERED:
    cls = objective_class(name)
    assert issubclass(cls, Objective) and cls.name == name, name
