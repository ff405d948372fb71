"""The import layers of .importlinter hold (imports only look down), and breaking them is caught."""

import ast
import configparser
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


def _contracts() -> dict[str, configparser.SectionProxy]:
  """The contracts of .importlinter by name: one for the package root, one per folder."""
  parser = configparser.ConfigParser()
  parser.read(REPO / ".importlinter")
  return {parser[s]["name"]: parser[s] for s in parser.sections()
          if s.startswith("importlinter:contract:")}


def _layer_names(contract: configparser.SectionProxy) -> set[str]:
  return {n.strip() for line in contract["layers"].splitlines() for n in line.split("|")
          if n.strip()}


def test_imports_only_look_down():
  r = lint(REPO)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
  contracts = _contracts()
  assert "Imports only look down" in contracts
  for name in contracts:
    assert f"{name} KEPT" in r.stdout, name


def test_an_upward_import_breaks_the_contract(tmp_path):
  """A model module importing the trainer (a lower layer looking up) fails the check."""
  shutil.copytree(REPO / "bertjax", tmp_path / "bertjax",
                  ignore=shutil.ignore_patterns("__pycache__", "samples"))
  shutil.copy(REPO / ".importlinter", tmp_path / ".importlinter")
  heads = tmp_path / "bertjax" / "models" / "heads.py"
  heads.write_text(heads.read_text() + "\nfrom bertjax.trainer import train  # an upward import\n")
  r = lint(tmp_path)
  assert r.returncode != 0
  assert "bertjax.models is not allowed to import bertjax.trainer" in r.stdout, r.stdout[-3000:]


def test_every_registered_objective_is_named_as_its_key():
  from bertjax.objective import Objective
  from bertjax.registry import REGISTERED, objective_class
  for name in REGISTERED:
    cls = objective_class(name)
    assert issubclass(cls, Objective) and cls.name == name, name


def _modules(package: str = "bertjax") -> list[str]:
  """Every module of a package, as its layers name them (bertjax.X.Y -> X for bertjax)."""
  base = REPO.joinpath(*package.split("."))
  names = set()
  for path in base.rglob("*.py"):
    parts = path.relative_to(base).with_suffix("").parts
    if parts != ("__init__",):
      names.add(parts[0])
  return sorted(names)


def test_every_module_sits_in_a_layer():
  """A new module must be placed in its folder's contract (or the root's), or nothing would
  check it."""
  containers = {c["containers"].strip(): _layer_names(c) for c in _contracts().values()}
  assert "bertjax" in containers
  for container, named in containers.items():
    assert set(_modules(container)) - named == set(), container


def test_the_package_root_holds_folders_and_few_modules():
  """At most 5 modules sit at the root of bertjax/, and every layer of the root contract is a
  folder or one of them; each folder of modules ordered among themselves has its own contract."""
  root_modules = {p.stem for p in (REPO / "bertjax").glob("*.py")}
  assert len(root_modules) <= 5, sorted(root_modules)
  contracts = {c["containers"].strip(): c for c in _contracts().values()}
  for name in _layer_names(contracts["bertjax"]):
    assert (REPO / "bertjax" / name / "__init__.py").is_file() or name in root_modules, name
  for folder in ("tools", "trainer", "config", "runtime", "core"):
    assert f"bertjax.{folder}" in contracts, folder


# The imports allowed inside functions, each with its reason: optional and measurably expensive
# (tensorboardX 1.3 s / 190 MB, tfds 0.3 s, torch and optuna (a sweep's search, the `sweep`
# extra) are not runtime dependencies), or the package
# root, which every `python -m bertjax.X` imports first and so stays light.
LAZY = {("bertjax/runtime/metric_writers.py", "tensorboardX"),
        ("bertjax/tasks/base.py", "tensorflow_datasets"),
        ("bertjax/tasks/base.py", "tensorflow_datasets.question_answering"),
        ("bertjax/tasks/base.py", "tensorflow_datasets.text"),
        ("bertjax/data/sources.py", "tensorflow_datasets"),
        ("bertjax/data/sources.py", "tensorflow_datasets.text"),
        ("bertjax/convert/readers.py", "torch"), ("bertjax/tools/gemm_rate.py", "torch"),
        ("bertjax/sweep/search.py", "optuna"),
        ("bertjax/__init__.py", "jax"), ("bertjax/__init__.py", "jax.numpy"),
        ("bertjax/__init__.py", "bertjax.models.architectures"), ("bertjax/__init__.py", "bertjax"),
        ("bertjax/__init__.py", "bertjax.core.errors"), ("bertjax/__init__.py", "bertjax.convert")}


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
