"""`config.distill` checked, and the layer maps it names (bertjax.objectives.distill)."""

from __future__ import annotations

import dataclasses

from bertjax.core.errors import fail

STUDENT_INITS = ("teacher_layers", "scratch")
# Objectives whose workdirs keep the architecture of their init_from rather than config.model.
# ModelConfig fields that decide parameter shapes: teacher_layers init needs them equal.
SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
                 "max_position_embeddings", "type_vocab_size", "embed_size", "use_pooler",
                 "pre_layer_norm", "architecture")

# ---------------------------------------------------------------------------------------------
# Settings.


@dataclasses.dataclass(frozen=True)
class Settings:
  """`config.distill` in checked form. layer_map: (student layer, teacher layer) pairs, 0-based."""
  teacher: str
  student_init: str
  temperature: float
  soft_weight: float
  hard_weight: float
  cosine_weight: float
  hidden_weight: float
  attention_weight: float
  layer_map_text: str
  init_layers_text: str
  layer_map: tuple[tuple[int, int], ...] = ()

  @classmethod
  def from_config(cls, config) -> "Settings":
    if "distill" not in config:
      fail(f"objective {config.objective} needs the config.distill settings; start from "
           "configs/distill.py")
    d = config.distill
    s = cls(teacher=str(d.teacher), student_init=str(d.student_init),
            temperature=float(d.temperature), soft_weight=float(d.soft_weight),
            hard_weight=float(d.hard_weight), cosine_weight=float(d.cosine_weight),
            hidden_weight=float(d.hidden_weight), attention_weight=float(d.attention_weight),
            layer_map_text=str(d.layer_map), init_layers_text=str(d.init_layers))
    if s.student_init not in STUDENT_INITS:
      fail(f"distill.student_init={s.student_init!r} is not one of {', '.join(STUDENT_INITS)}")
    if not s.temperature > 0:
      fail(f"distill.temperature={s.temperature} must be positive (DistilBERT uses 2.0)")
    weights = {k: getattr(s, k) for k in ("soft_weight", "hard_weight", "cosine_weight",
                                          "hidden_weight", "attention_weight")}
    negative = [k for k, v in weights.items() if v < 0]
    if negative:
      fail(f"distill.{negative[0]}={weights[negative[0]]} is negative; loss weights must be >= 0")
    if not any(weights.values()):
      fail("every distill.*_weight is 0, so there is nothing to train; set e.g. "
           "--config.distill.soft_weight=1.0")
    if (s.hidden_weight or s.attention_weight) and not s.layer_map_text.strip():
      fail("distill.hidden_weight / attention_weight need distill.layer_map (e.g. 'uniform' or "
           "'0:1,1:3,2:5': student layer : teacher layer); set --config.distill.layer_map")
    return s

  @property
  def uses_hidden(self) -> bool:
    return bool(self.cosine_weight or self.hidden_weight)

  @property
  def uses_attention(self) -> bool:
    return bool(self.attention_weight)


def parse_layer_map(text: str, student_layers: int,
                    teacher_layers: int) -> tuple[tuple[int, int], ...]:
  """'0:1,1:3' | 'uniform' | '' -> ((student layer, teacher layer), ...), 0-based, checked.

  'uniform' is TinyBERT's mapping: student layer i <-> teacher layer (i + 1) * T // S - 1, so the
  last layers meet (3 of 6: 0:1, 1:3, 2:5).
  """
  text = text.strip()
  if not text:
    return ()
  if text == "uniform":
    return tuple((i, (i + 1) * teacher_layers // student_layers - 1)
                 for i in range(student_layers))
  pairs = []
  for item in text.split(","):
    left, sep, right = (p.strip() for p in item.partition(":"))
    try:
      if not sep:
        raise ValueError(item)
      s, t = int(left), int(right)
    except ValueError:
      fail(f"distill.layer_map item {item.strip()!r} is not STUDENT:TEACHER layer numbers; write "
           "e.g. --config.distill.layer_map='0:1,1:3,2:5' or 'uniform'")
    if not 0 <= s < student_layers:
      fail(f"distill.layer_map {item.strip()!r} names student layer {s}, but the student has "
           f"{student_layers} layers (0..{student_layers - 1}); fix --config.distill.layer_map")
    if not 0 <= t < teacher_layers:
      fail(f"distill.layer_map {item.strip()!r} names teacher layer {t}, but the teacher has "
           f"{teacher_layers} layers (0..{teacher_layers - 1}); fix --config.distill.layer_map")
    pairs.append((s, t))
  return tuple(pairs)


def init_layer_sources(text: str, student_groups: int, teacher_groups: int) -> tuple[int, ...]:
  """Which teacher layer (group) each student layer starts from: `distill.init_layers` ('0,2,4')
  or, empty, every (T/S)-th one from the bottom (DistilBERT's 12 -> 6: 0, 2, 4, 6, 8, 10)."""
  if not text.strip():
    if student_groups > teacher_groups:
      fail(f"student_init=teacher_layers needs at most the teacher's {teacher_groups} layers, the "
           f"student has {student_groups}; lower model.num_hidden_layers or use "
           "--config.distill.student_init=scratch")
    return tuple(i * teacher_groups // student_groups for i in range(student_groups))
  try:
    layers = tuple(int(x) for x in text.split(","))
  except ValueError:
    fail(f"distill.init_layers={text!r} is not a comma-separated list of teacher layers")
  if len(layers) != student_groups:
    fail(f"distill.init_layers={text!r} names {len(layers)} teacher layers for a student of "
         f"{student_groups}; give one per student layer")
  bad = [t for t in layers if not 0 <= t < teacher_groups]
  if bad:
    fail(f"distill.init_layers names teacher layer {bad[0]}, but the teacher has {teacher_groups} "
         f"layers (0..{teacher_groups - 1}); fix --config.distill.init_layers")
  return layers
