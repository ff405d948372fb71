"""The allowed range of a numeric setting, declared beside the setting (bertjax/config/settings.py
for the trainer's, bertjax/models/config.py's fields for the model's) and checked from there."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Range:
  """lo <= value <= hi (a bound is strict when marked open); `also`: sentinel values allowed."""
  lo: float | None = None
  hi: float | None = None
  lo_open: bool = False
  hi_open: bool = False
  also: tuple = ()

  def holds(self, value) -> bool:
    if any(value is a or (value == a and type(value) is type(a)) for a in self.also):
      return True
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
      return False
    if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
      return False
    return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)

  def __str__(self) -> str:
    if self.hi is None:
      text = f"{'>' if self.lo_open else '>='} {self.lo}"
    else:
      text = (f"in {'(' if self.lo_open else '['}{self.lo}, {self.hi}"
              f"{')' if self.hi_open else ']'}")
    return " or ".join([text, *map(repr, self.also)])


AT_LEAST_1, NON_NEGATIVE, POSITIVE = Range(1), Range(0), Range(0, lo_open=True)
UNIT, OPEN_UNIT = Range(0, 1), Range(0, 1, lo_open=True, hi_open=True)
PROBABILITY = Range(0, 1, hi_open=True)   # dropout: 1 would drop everything
SHARE = Range(0, 1, lo_open=True)         # a fraction that must keep something
