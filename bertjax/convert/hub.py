"""A Hugging Face Hub model by name (`ORG/NAME`): its files fetched through huggingface_hub's
`snapshot_download`, which keeps them in its cache (HF_HUB_CACHE, default
~/.cache/huggingface/hub) and, with HF_HUB_OFFLINE=1, reads only that cache. Only the files a
conversion reads are fetched: the config, the weights and the tokenizer's files.
"""

from __future__ import annotations

import pathlib
import re

import huggingface_hub
from huggingface_hub import errors

from bertjax.core.errors import fail

# What from-hf reads (bertjax/convert/readers.py, hf_tokenizer.py); ELECTRA's both-parts layout
# keeps them in discriminator/ and generator/.
FILES = ["config.json", "*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin",
         "pytorch_model.bin.index.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
         "spiece.model", "sentencepiece.bpe.model", "special_tokens_map.json", "merges.txt",
         "vocab.json", "*/config.json", "*/*.safetensors", "*/pytorch_model*.bin"]
NAME = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


def snapshot(name: str) -> pathlib.Path:
  """The local folder of the Hub model `name` (ORG/NAME, or NAME), downloaded into or read from
  huggingface_hub's cache; a name it cannot find is one line."""
  if not NAME.match(name):
    fail(f"--model {name!r} is not a Hugging Face Hub name; give ORG/NAME (e.g. "
         "google-bert/bert-base-uncased), or a local folder with --model-dir")
  try:
    return pathlib.Path(huggingface_hub.snapshot_download(name, allow_patterns=FILES))
  except errors.LocalEntryNotFoundError:
    fail(f"--model {name}: not in the Hugging Face cache, and the Hub is not reachable or "
         "HF_HUB_OFFLINE is set; fix: download it once online (or `hf download "
         f"{name}`), or pass a local folder with --model-dir")
  except errors.RepositoryNotFoundError:
    fail(f"--model {name}: no such model on the Hugging Face Hub (or it is private: `hf auth "
         "login` first); fix: check the name")
  except errors.HfHubHTTPError as e:
    fail(f"--model {name}: the Hugging Face Hub answered {' '.join(str(e).split())[:200]}; "
         "fix: try again, or pass a local folder with --model-dir")
