"""SQuAD v1.1 / v2.0 fine-tuning with BERT's recipe (lr 3e-5, batch 32, 2 epochs, seq 384,
doc_stride 128, questions up to 64 tokens, answers up to 30).

  python launch.py --config configs/squad.py --workdir runs/squad11 \
      --config.init_from=runs/bert-base-uncased --config.data_dir=~/squad  # {train,dev}-v1.1.json
  python launch.py --config configs/squad.py:version=2.0 --workdir runs/squad20 \
      --config.init_from=runs/bert-base-uncased          # tfds squad/v2.0, built locally
  python launch.py --config configs/squad.py:runlocal --workdir /tmp/squad

Evaluations write WORKDIR/predictions/step_<N>/predictions.json (and null_odds.json for v2.0);
`python -m bertjax.tools.evaluate squad --data dev-v2.0.json --predictions .../predictions.json
--null_odds .../null_odds.json` scores them as the run did. For v2.0 the run reports the null
threshold that is best on dev (best_f1_thresh); pass it back as null_score_diff_threshold.

Variant `runlocal`: a tiny random-init model and a sentencepiece tokenizer trained on the
passages, trained on 600 questions of the SQuAD subset in BERTJAX_DATA (or ../shared/data) and
evaluated on the whole subset, which includes those questions: a smoke test, not a benchmark.
It scores the examples it trains on, and its start says so in a line ("warning: 600 of the ...
dev questions are among the 600 trained on").
"""

from bertjax.tasks.base import shared_data_dir
from configs.common import finetune_config, model_config, parse_variant


def get_config(arg=None):
  v = parse_variant(arg, "configs/squad.py", {"version": ("1.1", "2.0")}, version="1.1",
                    runlocal=False)
  c = finetune_config()
  c.objective = "squad"
  c.version = v.version  # 1.1 | 2.0 (unanswerable questions: null at [CLS])
  c.data_dir = ""                  # folder of the official json files; empty: tfds squad/v<version>
  c.train_file = ""                # in data_dir (or absolute); empty: train-v<version>.json
  c.dev_file = ""                  # in data_dir (or absolute); empty: dev-v<version>.json
  c.max_seq_length = 384           # [CLS] question [SEP] passage window [SEP]
  c.doc_stride = 128               # tokens between the starts of consecutive passage windows
  c.max_query_length = 64          # questions are cut to this many tokens
  c.max_answer_length = 30         # longest predicted answer, in tokens
  c.n_best_size = 20               # answers kept per question in nbest_predictions.json
  c.null_score_diff_threshold = 0.0  # v2.0: "" when null score - best span score exceeds this
  c.learning_rate = 3e-5
  c.num_epochs = 2.0               # converted to total_steps from the number of training windows
  c.total_steps = 0                # 0: num_epochs * training windows / batch_size
  c.max_train_examples = 0         # use only the first N training questions (0: all)
  c.best_metric = "f1"             # dev F1; the best params are kept in WORKDIR/best
  if v.runlocal:
    vocab = 3000
    c.model = model_config("bert-tiny", vocab_size=vocab, hidden_size=64, intermediate_size=128,
                           max_position_embeddings=128, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
    c.data.vocab_size = vocab      # sentencepiece trained on the passages and questions
    c.data_dir = shared_data_dir("squad")
    subset = "v2.0_dev_subset.json" if c.version == "2.0" else "v1.1_dev_subset.json"
    c.train_file = subset
    c.dev_file = subset
    c.max_seq_length = 128
    c.doc_stride = 64
    c.max_query_length = 32
    c.batch_size = 32
    c.learning_rate = 1e-3
    c.num_epochs = 3.0
    c.max_train_examples = 600
    c.log_every = 20
    c.tensorboard = False
  return c
