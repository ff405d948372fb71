"""Parameter shapes of every preset: a golden file, transformers' counts, the HF name mapping.

The golden file tests/golden/param_shapes.json lists, for each preset in
`bertjax.models.presets.PRESETS`, every Encoder parameter path -> shape (computed with
`jax.eval_shape`, so nothing is allocated). A change to the model's parameter tree shows up as a
diff there. After an intended change, regenerate it with

  python tests/test_param_shapes.py --regenerate

and review the diff before committing.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden" / "param_shapes.json"
if str(REPO) not in sys.path:  # Running as a script (--regenerate).
  sys.path.insert(0, str(REPO))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

from bertjax import convert  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax.models.encoder import init_params  # pylint: disable=wrong-import-position
from bertjax.models.architectures import encoder_for  # pylint: disable=wrong-import-position
from bertjax.models.presets import PRESETS, preset  # pylint: disable=wrong-import-position


def encoder_shapes(name: str) -> dict[str, list[int]]:
  """Flattened 'a/b/c' parameter path -> shape of the preset's encoder."""
  cfg = preset(name)
  tree = jax.eval_shape(lambda rng: init_params(encoder_for(cfg), cfg, rng), jax.random.key(0))
  return {"/".join(k.key for k in path): list(leaf.shape)
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def all_shapes() -> dict[str, dict[str, list[int]]]:
  return {name: encoder_shapes(name) for name in PRESETS}


def write_golden() -> None:
  GOLDEN.parent.mkdir(parents=True, exist_ok=True)
  # One parameter per line keeps diffs readable.
  lines = ["{"]
  for i, (name, shapes) in enumerate(all_shapes().items()):
    lines.append(f"  {json.dumps(name)}: {{")
    items = sorted(shapes.items())
    for j, (path, shape) in enumerate(items):
      comma = "," if j < len(items) - 1 else ""
      lines.append(f"    {json.dumps(path)}: {json.dumps(shape)}{comma}")
    lines.append("  }" + ("," if i < len(PRESETS) - 1 else ""))
  lines.append("}")
  GOLDEN.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_golden_param_shapes():
  golden = json.loads(GOLDEN.read_text())
  assert sorted(golden) == sorted(PRESETS), (
      "presets changed; regenerate with `python tests/test_param_shapes.py --regenerate`")
  for name in PRESETS:
    assert encoder_shapes(name) == golden[name], (
        f"{name}: Encoder params differ from {GOLDEN.name}; if intended, regenerate with "
        "`python tests/test_param_shapes.py --regenerate` and review the diff")


def test_golden_has_expected_landmarks():
  """Spot checks written by hand, so a wrong golden file cannot pass by regeneration alone."""
  golden = json.loads(GOLDEN.read_text())
  base = golden["bert-base"]
  assert base["embeddings/word_embeddings/embedding"] == [30522, 768]
  assert base["layer_11/attention/query/kernel"] == [768, 12, 64]
  assert base["layer_11/attention/output/kernel"] == [12, 64, 768]
  assert base["layer_0/intermediate/kernel"] == [768, 3072]
  assert "layer_12/output/kernel" not in base and "embedding_projection/kernel" not in base
  albert = golden["albert-base"]
  assert albert["embeddings/word_embeddings/embedding"] == [30000, 128]
  assert albert["embedding_projection/kernel"] == [128, 768]
  assert not any(k.startswith("layer_1/") for k in albert)  # All layers share layer_0.
  assert "pooler/kernel" not in golden["electra-small"]
  assert golden["roberta-base"]["embeddings/position_embeddings/embedding"] == [514, 768]
  modern = golden["modernbert-base"]
  assert modern["layer_21/attn/Wqkv/kernel"] == [768, 3, 12, 64]
  assert modern["layer_0/mlp/Wi/kernel"] == [768, 2, 1152]
  assert "layer_0/attn_norm/scale" not in modern and "layer_1/attn_norm/scale" in modern
  assert not any(k.endswith("/bias") for k in modern)  # norm_bias, attention_bias, mlp_bias off


_HF_BASE = {"bert": "BertModel", "roberta": "RobertaModel", "albert": "AlbertModel",
            "electra": "ElectraModel", "modernbert": "ModernBertModel"}


@pytest.mark.parametrize("name", list(PRESETS))
def test_param_count_matches_transformers(name):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  cfg = preset(name)
  hf_cfg = convert.model_config_to_hf_config(cfg)
  model_type = hf_cfg.pop("model_type")
  # The meta device builds the module tree without allocating or initializing weights.
  with torch.device("meta"):
    hf = getattr(transformers, _HF_BASE[model_type])(
        transformers.AutoConfig.for_model(model_type, **hf_cfg))
  hf_count = sum(p.numel() for p in hf.parameters())
  ours = sum(int(np.prod(s)) for s in encoder_shapes(name).values())
  assert ours == hf_count, (name, ours, hf_count)


@pytest.mark.parametrize("name", ["bert-base", "roberta-base", "albert-large", "electra-small",
                                  "electra-small-generator", "electra-base-generator",
                                  "modernbert-base"])
@pytest.mark.slow
def test_name_mapping_covers_model(name):
  """Every param of the model with its heads has exactly one HF tensor, with matching shape."""
  cfg = preset(name)
  heads = convert.architecture_heads(
      cfg.architecture, "generator" if name.endswith("generator") else None)
  want = {"/".join(k.key for k in path): tuple(leaf.shape) for path, leaf in
          jax.tree_util.tree_leaves_with_path(convert.abstract_params(cfg, heads))}
  mapped = {}
  for e in convert.encoder_entries(cfg) + [e for h in heads for e in convert.head_entries(cfg, h)]:
    # A zero-stride view: the real layout transforms, with no memory behind them.
    x = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), e.shape, (0,) * len(e.shape))
    to_ours = convert.tensor_to_ours
    mapped["/".join(e.path)] = to_ours(e.kind, x, cfg).shape
  assert mapped == want


if __name__ == "__main__":
  if sys.argv[1:] != ["--regenerate"]:
    sys.exit(f"usage: python {sys.argv[0]} --regenerate  (rewrites {GOLDEN})")
  write_golden()
  print(f"wrote {GOLDEN} ({len(PRESETS)} presets)")
