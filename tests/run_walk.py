"""A walk through a run's start: the bertjax modules entered from `train.train_and_evaluate` until
its train loop begins (the first step), recorded with `sys.setprofile` on a tiny in-process run
(the runlocal quickstart on synthetic data, one step).

    python tests/run_walk.py            # prints the figures of the bertjax that Python imports
    PYTHONPATH=/path/to/checkout python tests/run_walk.py

It imports nothing but bertjax and the standard library, so it walks any checkout. Figures:
  visits     calls from one bertjax module into a different one (the caller: the nearest bertjax
             frame up the stack, so a library calling back in counts from the module that called
             the library)
  modules    distinct bertjax modules entered
  climbs     visits from a module of a lower layer into one of a higher layer; the layers are
             the import contract's (.importlinter at the checkout's root): the package's layers,
             then each folder's own
  entries of a function: how many times it was called (e.g. `sharding.rules_from_config`)
  (a generator's frames are left out: each item drawn resumes one, which is iteration, not a
  call)
  derivations of the eval batch size: executions of a bertjax line that derives it (reads the
             `eval_batch_size` setting with the micro-batch or batch as its fallback), wherever
             it is written.
"""

from __future__ import annotations

import configparser
import contextlib
import dataclasses
import inspect
import linecache
import pathlib
import re
import sys
import tempfile
from typing import Callable, Iterator

# The run's start ends where this function of bertjax.trainer.train is entered.
LOOP = "_train_loop"
PACKAGE = "bertjax"
GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
MODELS = f"{PACKAGE}.models"
# A line deriving the eval batch size: the setting, else a fallback (the micro-batch, the batch).
DERIVES_EVAL_SIZE = re.compile(r"eval_batch_size.*\bor\b")


@dataclasses.dataclass
class Walk:
  visits: list[tuple[str, str, str]]            # (caller module, callee module, callee function)
  calls: dict[tuple[str, str], int]             # (module, function) -> times entered
  climbs: list[tuple[str, str, str]]
  derived_lines: dict[str, int] = dataclasses.field(default_factory=dict)  # "file:line" -> runs
  # The module running, in time order (calls and returns): its changes, and those into a higher
  # layer (a callee returning to its caller counts too: the path bouncing back up).
  sequence: list[str] = dataclasses.field(default_factory=list)
  sequence_climbs: int = 0

  @property
  def modules(self) -> set[str]:
    return {m for _, m, _ in self.visits} | {m for m, _ in self.calls}

  def entries(self, module: str, function: str) -> int:
    return self.calls.get((module, function), 0)

  def entered_from_outside(self, module: str) -> int:
    return sum(1 for caller, callee, _ in self.visits if callee == module and caller != module)

  def figures(self) -> dict[str, int]:
    return {"visits": len(self.visits), "modules": len(self.modules), "climbs": len(self.climbs),
            "sequence_changes": max(len(self.sequence) - 1, 0),
            "sequence_climbs": self.sequence_climbs}

  def outside_models(self) -> dict[str, int]:
    """The figures without the calls inside bertjax.models (a model's own modules, traced)."""
    inside = lambda a, b: a.startswith(MODELS) and b.startswith(MODELS)
    return {"visits": sum(1 for a, b, _ in self.visits if not inside(a, b)),
            "climbs": sum(1 for a, b, _ in self.climbs if not inside(a, b))}


def layer_ranks(root: pathlib.Path) -> Callable[[str], tuple[int, ...]]:
  """module name -> its rank (lower: a higher layer), from the contracts of `root/.importlinter`:
  the package's layers first, then the layers of the folder's own contract."""
  parser = configparser.ConfigParser()
  parser.read(root / ".importlinter")
  contracts = {}
  for section in parser.sections():
    if parser.get(section, "type", fallback="") != "layers":
      continue
    container = parser.get(section, "containers").strip()
    ranks = {}
    for i, line in enumerate(l for l in parser.get(section, "layers").splitlines() if l.strip()):
      for name in line.split("|"):
        ranks[name.strip()] = i
    contracts[container] = ranks

  def rank(module: str) -> tuple[int, ...]:
    parts = module.split(".")
    out = []
    for depth in range(1, len(parts)):
      ranks = contracts.get(".".join(parts[:depth]))
      if ranks is None or parts[depth] not in ranks:
        break
      out.append(ranks[parts[depth]])
    return tuple(out)
  return rank


def climbs_up(rank: Callable[[str], tuple[int, ...]], caller: str, callee: str) -> bool:
  """Whether `callee` sits in a higher layer than `caller` (compared down to the deepest contract
  both are ordered by; modules on one line, or one inside the other, are not above each other)."""
  a, b = rank(caller), rank(callee)
  for x, y in zip(a, b):
    if x != y:
      return y < x
  return False


def _module_of(frame) -> str | None:
  name = frame.f_globals.get("__name__", "")
  return name if name == PACKAGE or name.startswith(PACKAGE + ".") else None


def _bertjax_caller(frame) -> str | None:
  frame = frame.f_back
  while frame is not None:
    module = _module_of(frame)
    if module:
      return module
    frame = frame.f_back
  return None


@contextlib.contextmanager
def recording(start: str = "train_and_evaluate", stop: str = LOOP) -> Iterator[Walk]:
  """Records the calls between the first entry of bertjax.trainer.train's `start` and of its
  `stop` (this thread only; module bodies run by an import are not counted)."""
  import bertjax
  rank = layer_ranks(pathlib.Path(bertjax.__file__).resolve().parent.parent)
  walk = Walk(visits=[], calls={}, climbs=[])
  state = {"on": False, "done": False}
  train_module = f"{PACKAGE}.trainer.train"

  def now_in(module: str | None) -> None:
    if module is None or (walk.sequence and walk.sequence[-1] == module):
      return
    if walk.sequence and climbs_up(rank, walk.sequence[-1], module):
      walk.sequence_climbs += 1
    walk.sequence.append(module)

  def profile(frame, event, arg):
    if (event == "return" and state["on"] and not state["done"] and _module_of(frame)
        and not frame.f_code.co_flags & GENERATOR_FLAGS):
      now_in(_bertjax_caller(frame))
    if event != "call" or state["done"]:
      return
    module = _module_of(frame)
    if module is None or frame.f_code.co_name == "<module>":
      return
    if frame.f_code.co_flags & GENERATOR_FLAGS:  # iterating a generator: not counted as calls
      return
    function = frame.f_code.co_name
    if module == train_module and function == start:
      state["on"] = True
    if module == train_module and function == stop:
      state["done"] = True
      return
    if not state["on"]:
      return
    walk.calls[(module, function)] = walk.calls.get((module, function), 0) + 1
    now_in(module)
    caller = _bertjax_caller(frame)
    if caller is not None and caller != module:
      walk.visits.append((caller, module, function))
      if climbs_up(rank, caller, module):
        walk.climbs.append((caller, module, function))

  def lines(frame, event, arg):
    if event == "line" and state["on"] and not state["done"]:
      text = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
      if DERIVES_EVAL_SIZE.search(text) and not text.lstrip().startswith("#"):
        where = f"{frame.f_globals['__name__']}:{frame.f_lineno}"
        walk.derived_lines[where] = walk.derived_lines.get(where, 0) + 1
    return lines

  def trace(frame, event, arg):  # line events of bertjax frames only
    return lines if _module_of(frame) else None

  sys.setprofile(profile)
  sys.settrace(trace)
  try:
    yield walk
  finally:
    sys.settrace(None)
    sys.setprofile(None)


def tiny_quickstart(**overrides):
  """The runlocal quickstart, one step on synthetic data with a tiny model."""
  base = {"data.synthetic": True, "model.vocab_size": 200, "model.hidden_size": 32,
          "model.intermediate_size": 64, "model.num_attention_heads": 2,
          "model.num_hidden_layers": 2, "max_seq_length": 16, "max_predictions_per_seq": 4,
          "tensorboard": False, "async_checkpointing": False, "total_steps": 1,
          "eval_every": 0, "log_every": 1, "checkpoint_every": 1}
  base.update(overrides)
  return _load("configs/quickstart.py:runlocal", base)


def tiny_glue(data_dir: str, **overrides):
  """The runlocal GLUE RTE fine-tuning, one step with a tiny model on `data_dir`'s RTE/ (its
  tokenizer trained on the training text)."""
  return _load("configs/glue.py:task=rte,runlocal", {
      "model.hidden_size": 32, "model.intermediate_size": 64, "model.num_attention_heads": 2,
      "model.num_hidden_layers": 2, "tensorboard": False, "async_checkpointing": False,
      "checkpoint_every": 100000, "total_steps": 1, "eval_every": 0, "data_dir": data_dir,
      **overrides})


def _load(spec: str, overrides: dict):
  import bertjax
  from bertjax.config import config_lib
  root = pathlib.Path(bertjax.__file__).resolve().parent.parent
  config = config_lib.load_config_file(str(root / spec))
  config_lib.apply_overrides(config, [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                                      for k, v in overrides.items()])
  return config


def walk_a_run(workdir: pathlib.Path, config=None) -> Walk:
  """Trains `config` (default: `tiny_quickstart()`) in `workdir`, recording its start."""
  from bertjax.trainer import train
  config = tiny_quickstart() if config is None else config
  with recording() as walk:
    train.train_and_evaluate(config, workdir)
  return walk


RULES = [(f"{PACKAGE}.runtime.sharding", "rules_from_config")]
VALIDATOR = f"{PACKAGE}.config.config_checks"


def _counted(items: list) -> list[tuple]:
  counts: dict = {}
  for item in items:
    counts[item] = counts.get(item, 0) + 1
  return list(counts.items())


def report(walk: Walk) -> str:
  figures = walk.figures()
  outside = walk.outside_models()
  lines = [f"visits {figures['visits']}  modules {figures['modules']}  climbs {figures['climbs']}"
           f"  (outside models: visits {outside['visits']}, climbs {outside['climbs']})",
           f"in time order (calls and returns): {figures['sequence_changes']} changes of module, "
           f"{figures['sequence_climbs']} into a higher layer",
           f"config_checks entered {walk.entered_from_outside(VALIDATOR)} times: " + ", ".join(
               f"{f} x{n}" for (m, f), n in sorted(walk.calls.items()) if m == VALIDATOR
               and any(c == m and fn == f and caller != m for caller, c, fn in walk.visits)),
           "rules derived: " + ", ".join(f"{f} x{walk.entries(m, f)}" for m, f in RULES),
           f"eval batch size derived {sum(walk.derived_lines.values())} times: " + ", ".join(
               f"{w.removeprefix('bertjax.')} x{n}" for w, n in sorted(walk.derived_lines.items())),
           "climbs: " + "; ".join(
               f"{a.removeprefix('bertjax.')} -> {b.removeprefix('bertjax.')}.{f}"
               + (f" x{n}" if n > 1 else "") for (a, b, f), n in _counted(walk.climbs))]
  return "\n".join(lines)


if __name__ == "__main__":
  # python tests/run_walk.py [GLUE_ROOT]: with a GLUE folder (holding RTE/), a fine-tuning run's
  # walk (tiny_glue) after the pretraining one's.
  import jax
  jax.config.update("jax_platforms", "cpu")
  with tempfile.TemporaryDirectory() as tmp:
    print("pretraining (configs/quickstart.py:runlocal, 1 step):")
    print(report(walk_a_run(pathlib.Path(tmp) / "run")))
    if len(sys.argv) > 1:
      print(f"fine-tuning (configs/glue.py:task=rte,runlocal, 1 step, data_dir={sys.argv[1]}):")
      print(report(walk_a_run(pathlib.Path(tmp) / "glue", tiny_glue(sys.argv[1]))))
