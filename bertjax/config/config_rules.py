"""Every setting's allowed values, as `bertjax.config.config_checks` reads them: the range of each
numeric setting (RULES) and the choices of each named one (CHOICES), derived from the settings' one
declaration (bertjax/config/settings.py: default, check and help in one row). The checks run before
a run (or a sweep's points) prepares, trains or writes anything."""

from __future__ import annotations

from typing import Any

from bertjax.config import settings
# The ranges are declared with the settings; their names are also read from here.
from bertjax.core.ranges import (AT_LEAST_1, NON_NEGATIVE, OPEN_UNIT, POSITIVE, PROBABILITY, SHARE,
                                 UNIT, Range)

__all__ = ["AT_LEAST_1", "CHOICES", "NON_NEGATIVE", "OPEN_UNIT", "POSITIVE", "PROBABILITY",
           "RULES", "Range", "SHARE", "UNIT", "choices", "rules"]


def rules() -> tuple[tuple[str, Range, str, Any], ...]:
  """(key, range, its help, an example value for the fix) of every ranged setting declared now.
  A key a config lacks is not checked."""
  return tuple((s.key, s.check, s.help, s.fix) for s in settings.declared()
               if isinstance(s.check, Range))


def choices() -> tuple[tuple[str, tuple[str, ...]], ...]:
  """(key, the values allowed) of every setting that names one of a few choices (refused before
  data preparation rather than after); the first value is the fix suggested."""
  return tuple((s.key, tuple(s.check)) for s in settings.declared()
               if isinstance(s.check, tuple))


RULES = rules()
CHOICES = choices()
