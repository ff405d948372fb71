"""Every config file of configs/ and its variants, resolved to plain JSON: the fixture
tests/golden/resolved_configs.json holds them as they were before the settings were declared
in one table (bertjax/config/settings.py), so a change to how defaults are built cannot move a
value.

`python -m tests.resolved_configs` rewrites the fixture (only when a config is meant to change).
"""

import json
import os
import pathlib
import sys

from bertjax.config import config_lib
from bertjax.runtime import sharding

REPO = pathlib.Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests/golden/resolved_configs.json"


def variants() -> list[str]:
  """`file.py[:arg]` for every config file and each of its variant options taken alone."""
  sys.path.insert(0, str(REPO))
  from configs import albert, bert, context_check, distill, electra, glue, roberta, spanbert
  specs = ["quickstart.py", "quickstart.py:runlocal", "modernbert.py", "modernbert.py:runlocal"]
  for name, module in (("albert", albert), ("bert", bert), ("electra", electra),
                       ("roberta", roberta), ("spanbert", spanbert)):
    specs += [f"{name}.py:size={s}" for s in module.SIZES] + [f"{name}.py", f"{name}.py:runlocal"]
  specs += ["bert.py:seq512", "bert.py:lamb"]
  specs += [f"distill.py:student={s}" for s in distill.STUDENTS]
  specs += ["distill.py", "distill.py:runlocal", "distill.py:task=rte", "distill.py:task=sst2"]
  specs += [f"glue.py:task={t}" for t in glue.TASKS] + ["glue.py", "glue.py:runlocal"]
  specs += ["squad.py", "squad.py:version=2.0", "squad.py:runlocal"]
  specs += ["ner.py", "ner.py:task=pos", "ner.py:runlocal"]
  specs += [f"context_check.py:objective={o}" for o in context_check.OBJECTIVES]
  return specs


def _plain(value):
  if isinstance(value, dict):
    return {k: _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return value


def resolve(spec: str) -> str:
  """The config `spec` as sorted JSON; logical_rules as the rules a run applies (() was the
  default's spelling before the rules became config data) and the repository path as <repo>."""
  config = config_lib.load_config_file(str(REPO / "configs" / spec))
  values = _plain(config.to_dict())
  values["logical_rules"] = _plain(sharding.rules_from_config(config))
  return json.dumps(values, sort_keys=True).replace(str(REPO), "<repo>")


def resolve_all() -> dict[str, str]:
  """Every variant resolved; with no shared data folder, so that data_dir defaults are ""."""
  saved = os.environ.get("BERTJAX_DATA")
  os.environ["BERTJAX_DATA"] = str(REPO / "tests/golden/no-shared-data")
  try:
    return {spec: resolve(spec) for spec in variants()}
  finally:
    if saved is None:
      del os.environ["BERTJAX_DATA"]
    else:
      os.environ["BERTJAX_DATA"] = saved


if __name__ == "__main__":
  FIXTURE.write_text(json.dumps({k: json.loads(v) for k, v in resolve_all().items()},
                                indent=1, sort_keys=True) + "\n")
  print(f"wrote {FIXTURE}")
