"""The import layers of .importlinter hold (imports only look down), and breaking them is caught."""

import ast
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


def _modules() -> list[str]:
  """Every module of the package, as the layers name them (bertjax.X -> X)."""
  names = set()
  for path in (REPO / "bertjax").rglob("*.py"):
    parts = path.relative_to(REPO / "bertjax").with_suffix("").parts
    if parts != ("__init__",):
      names.add(parts[0])
  return sorted(names)


def test_every_module_sits_in_a_layer():
  """A new top-level module must be placed in the contract, or nothing would check it."""
  text = (REPO / ".importlinter").read_text()
  layers = text.split("layers =", 1)[1]
  named = {n.strip() for line in layers.splitlines() for n in line.split("|") if n.strip()}
  assert set(_modules()) - named == set()


# The imports allowed inside functions, each with its reason: optional and measurably expensive
# (tensorboardX 1.3 s / 190 MB, tfds 0.3 s, torch is not a runtime dependency), or the package
# root, which every `python -m bertjax.X` imports first and so stays light.
LAZY = {("bertjax/metric_writers.py", "tensorboardX"),
        ("bertjax/tasks/base.py", "tensorflow_datasets"),
        ("bertjax/tasks/base.py", "tensorflow_datasets.question_answering"),
        ("bertjax/tasks/base.py", "tensorflow_datasets.text"),
        ("bertjax/data/sources.py", "tensorflow_datasets"),
        ("bertjax/data/sources.py", "tensorflow_datasets.text"),
        ("bertjax/convert/readers.py", "torch"),
        ("bertjax/__init__.py", "jax"), ("bertjax/__init__.py", "jax.numpy"),
        ("bertjax/__init__.py", "bertjax.models.modernbert"), ("bertjax/__init__.py", "bertjax"),
        ("bertjax/__init__.py", "bertjax.errors"), ("bertjax/__init__.py", "bertjax.convert")}


def test_imports_sit_at_module_top_unless_listed():
  found = set()
  for path in [*sorted((REPO / "bertjax").rglob("*.py")), REPO / "launch.py"]:
    tree = ast.parse(path.read_text())
    for fn in ast.walk(tree):
      if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for node in ast.walk(fn):
          if isinstance(node, ast.Import):
            found |= {(str(path.relative_to(REPO)), a.name) for a in node.names}
          elif isinstance(node, ast.ImportFrom):
            found.add((str(path.relative_to(REPO)), node.module))
  assert found - LAZY == set()
