"""Reading Hugging Face folders: config.json, safetensors (with numpy) and pytorch_model.bin."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from bertjax.core.errors import fail

PathLike = str | os.PathLike

# ----------------------------------------------------------------------------- reading HF folders


def one_line(e: BaseException) -> str:
  lines = str(e).strip().splitlines()
  return lines[0] if lines else type(e).__name__


_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
              "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def _read_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
  try:
    return load_file(str(path))
  except TypeError:
    pass  # numpy has no bfloat16: parse the (simple) format ourselves below.
  except Exception as e:  # pylint: disable=broad-except
    fail(f"cannot read {path}: {one_line(e)}; re-download or re-save the checkpoint")
  # Layout: 8-byte little-endian header length, a JSON header, then the raw tensor bytes.
  with open(path, "rb") as f:
    n = int.from_bytes(f.read(8), "little")
    header = json.loads(f.read(n))
    data = f.read()
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    start, end = info["data_offsets"]
    buf = data[start:end]
    if info["dtype"] == "BF16":
      # bfloat16 is the top half of a float32.
      x = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif info["dtype"] in _ST_DTYPES:
      x = np.frombuffer(buf, _ST_DTYPES[info["dtype"]])
    else:
      fail(f"cannot read {path}: tensor {name} has unsupported dtype {info['dtype']}")
    out[name] = x.reshape(info["shape"])
  return out


def _read_torch_bin(path: pathlib.Path) -> dict[str, np.ndarray]:
  """Unpickles a pytorch_model.bin; the one place torch is needed."""
  try:  # torch is not a runtime dependency (requirements-dev.txt): only this reader needs it
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    fail(f"{path} is a PyTorch pickle and reading it needs torch, which is not installed; "
         "install torch or save the checkpoint as model.safetensors")
  try:
    state = torch.load(str(path), map_location="cpu", weights_only=True)
  except Exception as e:  # pylint: disable=broad-except
    fail(f"cannot read {path}: {one_line(e)}; re-download or re-save the checkpoint")
  return {k: (v.float() if v.is_floating_point() else v).numpy() for k, v in state.items()}


def read_hf_config(model_dir: PathLike) -> dict[str, Any]:
  d = pathlib.Path(model_dir)
  text = str(model_dir)
  if not d.is_dir() and (d.exists() or d.is_absolute() or text.startswith((".", "~"))
                         or text.count("/") > 1):  # a path, which no hub name looks like
    fail(f"model directory {d} {'is a file' if d.exists() else 'not found'}; --model-dir "
         "takes a local Hugging Face model folder (config.json + model.safetensors)")
  if not d.is_dir():
    hub = f"hf download {model_dir} --local-dir {d.name}"
    fail(f"model directory {d} not found; from-hf takes only a local folder (config.json + "
         f"model.safetensors), not a Hugging Face hub name: download one first ({hub}, or "
         "save_pretrained it from transformers) and pass that folder to --model-dir, or pass "
         f"--model {model_dir} to fetch it through huggingface_hub")
  path = d / "config.json"
  if not path.is_file():
    fail(f"{path} not found; --model-dir must be a Hugging Face model folder (config.json and "
         "model.safetensors or pytorch_model.bin)")
  try:
    hf = json.loads(path.read_text())
  except (ValueError, OSError) as e:
    fail(f"cannot read {path}: {one_line(e)}; it must be a transformers config.json")
  if not isinstance(hf, dict):
    fail(f"{path} is not a JSON object; it must be a transformers config.json")
  return hf


def read_hf_weights(model_dir: PathLike) -> dict[str, np.ndarray]:
  """All tensors of a folder: model.safetensors, pytorch_model.bin or their sharded forms."""
  d = pathlib.Path(model_dir)
  for name, reader in (("model.safetensors", _read_safetensors),
                       ("pytorch_model.bin", _read_torch_bin)):
    if (d / name).is_file():
      return reader(d / name)
    index = d / f"{name}.index.json"
    if index.is_file():
      try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
      except (ValueError, KeyError, OSError) as e:
        fail(f"cannot read {index}: {one_line(e)}; re-download the checkpoint")
      out = {}
      for shard in shards:
        if not (d / shard).is_file():
          fail(f"{d / shard} not found (listed in {index.name}); re-download the checkpoint")
        out.update(reader(d / shard))
      return out
  fail(f"no weights in {d}: expected model.safetensors or pytorch_model.bin next to config.json")
