"""Tokenizers for BERT-family encoders behind one small interface.

Four kinds, each stored as a folder of its native files plus a small `tokenizer_config.json`
(base.KIND_FILES lists them with the names transformers gives them, e.g. spiece.model):
  sentencepiece  spm.model                 trained here (unigram or BPE) with ids 0..4 reserved for
                                           [PAD] [UNK] [CLS] [SEP] [MASK]
  wordpiece      vocab.txt                 BERT checkpoints (cased or uncased)
  bpe            vocab.json + merges.txt   RoBERTa's byte-level BPE
  json           tokenizer.json            a whole `tokenizers` pipeline (ModernBERT's BPE)

`load_tokenizer(dir)` detects the kind from the files, so a prepared corpus or a checkpoint
folder carries everything needed to reproduce its token ids. `encode` never adds special tokens:
the pretraining and fine-tuning pipelines place [CLS]/[SEP] themselves.

Command line (train a sentencepiece vocabulary):
  python -m bertjax.data.tokenizers train --input 'corpus/*.txt' --output tok/ \
      --vocab_size 32000 --model_type unigram [--lowercase]

By concern: `base` (the interface, file names, special tokens), `spm_tokenizer` (sentencepiece,
loading and training), `vocab_tokenizers` (WordPiece and byte-level BPE from vocabulary files),
`loading` (`load_tokenizer`), `__main__` (the command line).
"""

from bertjax.data.tokenizers.base import (BERT_SPECIALS, BPE_MERGES, BPE_VOCAB, CONFIG_FILE,
                                          HF_SPM_FILE, KIND_FILES, KINDS, ROBERTA_SPECIALS,
                                          SETTINGS_FILES, SPECIAL_TOKENS_MAP, SPM_FILE,
                                          SPM_SPECIALS, TOKENIZER_FILES, TOKENIZER_JSON,
                                          WORDPIECE_VOCAB, Tokenizer, expected_files, kind_files)
from bertjax.data.tokenizers.loading import load_checked, load_tokenizer
from bertjax.data.tokenizers.spm_tokenizer import SentencePieceTokenizer, train_sentencepiece
from bertjax.data.tokenizers.vocab_tokenizers import (ByteLevelBPETokenizer, JsonTokenizer,
                                                     WordPieceTokenizer)

__all__ = ["BERT_SPECIALS", "BPE_MERGES", "BPE_VOCAB", "CONFIG_FILE", "HF_SPM_FILE", "KIND_FILES",
           "KINDS", "ROBERTA_SPECIALS", "SETTINGS_FILES", "SPECIAL_TOKENS_MAP", "SPM_FILE",
           "SPM_SPECIALS", "TOKENIZER_FILES", "TOKENIZER_JSON", "WORDPIECE_VOCAB",
           "expected_files", "kind_files", "load_checked",
           "ByteLevelBPETokenizer", "JsonTokenizer", "SentencePieceTokenizer", "Tokenizer",
           "WordPieceTokenizer", "load_tokenizer", "train_sentencepiece"]
