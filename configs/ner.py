"""CoNLL-2003 tagging: named entities (default) or part-of-speech tags (`:task=pos`), with BERT's
fine-tuning recipe (lr 5e-5, batch 32, 3 epochs; the first sub-token of each word is labelled).

  python launch.py --config configs/ner.py --workdir runs/ner \
      --config.init_from=runs/bert-base-cased --config.data_dir=~/conll2003  # train/valid/test.txt
  python launch.py --config configs/ner.py:task=pos --workdir runs/pos \
      --config.init_from=runs/bert-base-cased            # tfds conll2003, built locally
  python launch.py --config configs/ner.py:runlocal --workdir /tmp/ner

Evaluations write WORKDIR/predictions/step_<N>/dev_predictions.txt (`token tag`), scored by
`python -m bertjax.tools.evaluate ner --data valid.txt --predictions ...` exactly as the run scored
it; the final one also predicts and scores the test file. NER needs a cased checkpoint.

BERT's feature-based NER (a tagger over the frozen encoder's last four layers concatenated):
`--config.freeze.encoder=True --config.head.features=concat` (README, "Frozen encoder").

Variant `runlocal`: a tiny random-init model and a sentencepiece tokenizer trained on the
sentences, trained on 1000 sentences of CoNLL-2003 test.txt and evaluated on valid.txt (the
project's data folder has no train split): a smoke test, not a benchmark.
"""

from bertjax.tasks.base import shared_data_dir
from configs.common import finetune_config, model_config, parse_variant


def get_config(arg=None):
  v = parse_variant(arg, "configs/ner.py", {"task": ("ner", "pos")}, task="ner", runlocal=False)
  c = finetune_config()
  c.objective = "ner"
  c.task = v.task  # ner (entity F1) | pos (token accuracy)
  c.data_dir = ""                  # folder with CoNLL-2003 files; empty: tfds conll2003
  c.train_file = ""                # in data_dir (or absolute); empty: train.txt
  c.dev_file = ""                  # in data_dir (or absolute); empty: valid.txt
  c.test_file = ""                 # in data_dir (or absolute); empty: test.txt if there; none: skip
  c.max_seq_length = 128           # longer sentences are split at word boundaries into several rows
  c.learning_rate = 5e-5
  c.num_epochs = 3.0               # converted to total_steps from the number of training rows
  c.total_steps = 0                # 0: num_epochs * training rows / batch_size
  c.max_train_examples = 0         # use only the first N training sentences (0: all)
  # The dev metric whose best parameters are kept in WORKDIR/best.
  c.best_metric = "f1" if c.task == "ner" else "accuracy"
  if v.runlocal:
    vocab = 3000
    c.model = model_config("bert-tiny", vocab_size=vocab, hidden_size=64, intermediate_size=128,
                           max_position_embeddings=128, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
    c.data.vocab_size = vocab      # sentencepiece trained on the training sentences
    c.data_dir = shared_data_dir("conll2003")
    c.train_file = "test.txt"
    c.dev_file = "valid.txt"
    c.test_file = "none"           # no test predictions: test.txt is the training data here
    c.max_seq_length = 64
    c.batch_size = 32
    c.learning_rate = 2e-3
    c.num_epochs = 5.0
    c.max_train_examples = 1000
    c.log_every = 20
    c.tensorboard = False
  return c
