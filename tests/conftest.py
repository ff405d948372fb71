"""Shared test settings.

Real data lives outside the project (see ../shared/data/README.md). Tests find it through
BERTJAX_DATA, defaulting to ../shared/data next to the repository, and skip with a reason when
it is absent.
"""

import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
DATA_DIR = pathlib.Path(os.environ.get("BERTJAX_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture
def data_dir() -> pathlib.Path:
  if not DATA_DIR.is_dir():
    pytest.skip(f"shared data not found at {DATA_DIR}; set BERTJAX_DATA to its folder")
  return DATA_DIR
