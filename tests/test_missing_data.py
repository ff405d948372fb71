"""Without the shared data folder, the task recipes' runlocal variants say where it is looked for.

Seen failing on dd89774: GLUE runlocal fell back to tfds (`cannot open tfds glue/rte ... build it
with tfds build`) and NER said `train file not found: test.txt`; neither named BERTJAX_DATA,
the actual fix.
"""

from __future__ import annotations

import pytest

from bertjax.core.errors import UserError
from bertjax.trainer import train

from helpers import TINY, load_config


@pytest.mark.parametrize("spec, first", [
    ("configs/glue.py:task=rte,runlocal", "tfds glue/rte"),
    ("configs/ner.py:runlocal", "CoNLL-2003 train file not found: test.txt"),
    ("configs/squad.py:runlocal", "SQuAD train file not found"),
])
def test_missing_data_names_the_shared_folder(tmp_path, monkeypatch, spec, first):
  nowhere = tmp_path / "no-data"
  monkeypatch.setenv("BERTJAX_DATA", str(nowhere))
  config = load_config(spec, **TINY)
  with pytest.raises(UserError) as e:
    train.train_and_evaluate(config, tmp_path / "run")
  message = str(e.value)
  assert first in message and "\n" not in message, message
  assert (f"the runlocal variants read the shared data folder, BERTJAX_DATA (now {nowhere}, "
          "which does not exist): set BERTJAX_DATA to that folder") in message, message
