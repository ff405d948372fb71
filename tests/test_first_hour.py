"""What a researcher meets in their first hour (issue 52, "The first hour"): the advice and
defaults a first run reads. Each test is in-process and small (no training unless it says so)."""

import pytest

from bertjax.convert import readers
from bertjax.core.errors import UserError

from helpers import REPO


def test_hub_download_advice_names_the_current_command():
  """huggingface_hub replaced `huggingface-cli download` by `hf download`: the refusal of a hub
  name, README and the distillation recipe name the command that exists."""
  with pytest.raises(UserError) as refused:
    readers.read_hf_config("bert-base-uncased")
  assert "(hf download bert-base-uncased --local-dir bert-base-uncased" in str(refused.value)
  for doc in (REPO / "README.md", REPO / "configs" / "distill.py"):
    text = doc.read_text()
    assert "hf download " in text and "huggingface-cli" not in text, doc
