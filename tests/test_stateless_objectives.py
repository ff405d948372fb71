"""Objectives and tasks are stateless: built without arguments, they hold nothing and accept no
attribute, so the config, model, tokenizer and data are always passed, never kept."""

import ast
import importlib
import pathlib

import pytest

from bertjax.objective import Objective
from bertjax.registry import REGISTERED, objective_class

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "bertjax"
SOURCES = [PACKAGE / "objective.py", *sorted((PACKAGE / "objectives").glob("*.py")),
           *sorted((PACKAGE / "tasks").glob("*.py"))]


def _module_name(path: pathlib.Path) -> str:
  return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def _objective_classes(path: pathlib.Path):
  """(class node, class) of every Objective subclass defined in the file."""
  module = importlib.import_module(_module_name(path))
  for node in ast.parse(path.read_text()).body:
    if isinstance(node, ast.ClassDef):
      cls = getattr(module, node.name)
      if isinstance(cls, type) and issubclass(cls, Objective):
        yield node, cls


def _writes_to_self(method: ast.FunctionDef) -> list[str]:
  """`self.x = ...`, `self.x += ...`, `setattr(self, ...)` and `self.__dict__` uses in a method."""
  found = []
  for node in ast.walk(method):
    targets = []
    if isinstance(node, ast.Assign):
      targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
      targets = [node.target]
    for t in targets:
      for sub in ast.walk(t):
        if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
            and sub.value.id == "self"):
          found.append(f"line {sub.lineno}: self.{sub.attr} =")
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id == "setattr" and node.args and isinstance(node.args[0], ast.Name)
        and node.args[0].id == "self"):
      found.append(f"line {node.lineno}: setattr(self, ...)")
    if isinstance(node, ast.Attribute) and node.attr == "__dict__":
      found.append(f"line {node.lineno}: __dict__")
  return found


def test_the_scan_finds_objective_classes_and_catches_a_write():
  classes = [cls for path in SOURCES for _, cls in _objective_classes(path)]
  assert {objective_class(name) for name in REGISTERED} <= set(classes)
  method = ast.parse("def evaluate(self, config):\n  self.config = config\n").body[0]
  assert _writes_to_self(method) == ["line 2: self.config ="]


def test_no_objective_or_task_assigns_to_self():
  offences = []
  for path in SOURCES:
    for node, cls in _objective_classes(path):
      for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
          if item.name == "__init__":
            offences.append(f"{path.name}: {cls.__name__} defines __init__")
          offences += [f"{path.name}: {cls.__name__}.{item.name} {w}"
                       for w in _writes_to_self(item)]
  assert not offences, offences


@pytest.mark.parametrize("name", sorted(REGISTERED))
def test_every_registered_objective_is_built_without_arguments_and_refuses_state(name):
  objective = objective_class(name)()
  assert not vars(objective)
  with pytest.raises(AttributeError, match="objectives are stateless"):
    objective.config = None
  with pytest.raises(AttributeError, match="objectives are stateless"):
    setattr(objective, "tokenizer", object())
