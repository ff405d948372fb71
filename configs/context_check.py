"""Context check: does an objective learn more than unigram statistics? A tiny model on a generated
language whose masked words follow from their neighbours (bertjax/data/synthetic.py).

  python launch.py --config configs/context_check.py --workdir runs/ctx_mlm_nsp
  python launch.py --config configs/context_check.py:objective=rtd --workdir runs/ctx_rtd
  python launch.py --config configs/context_check.py:objective=mlm --workdir runs/ctx_teacher
  python launch.py --config configs/context_check.py:objective=distill --workdir runs/ctx_student \
      --config.distill.teacher=runs/ctx_teacher

On WikiText a tiny model first falls to the corpus's unigram entropy whether or not its objective
is right; here a working objective passes the context-free bound (`synthetic.
context_free_accuracy` of the eval batches, about 0.15: the 10% unchanged tokens plus the most
frequent label) within a few hundred steps, NSP passes chance and ELECTRA's discriminator passes
always answering "original" (by step ~500, at its own lr below); a broken one (labels at the
wrong rows, attention to itself only, a head reading the wrong rows) stays at the bound.
tests/test_context.py runs each objective and a broken twin; experiments/context_checks.md has
the measured curves. SOP passes chance on rows of 24 tokens (mlm_sop below).
About a minute per objective on 2 CPU cores.

Variants: objective=mlm_nsp (default) | mlm | mlm_sop | span_sbo | rtd | distill; arch=bert
(default: bert-tiny's shape) | modernbert (modernbert-tiny's: 3 layers, layer 0 global, 1 and 2
within a window; not for NSP/SOP, which need token types):

  python launch.py --config configs/context_check.py:objective=mlm,arch=modernbert \
      --workdir runs/ctx_mb_mlm
"""

from bertjax.data.synthetic import CycleLanguage
from configs.common import base_config, model_config, parse_variant
from configs.distill import distill_settings

OBJECTIVES = ("mlm_nsp", "mlm", "mlm_sop", "span_sbo", "rtd", "distill")


def get_config(arg=None):
  v = parse_variant(arg, "configs/context_check.py", {"objective": OBJECTIVES,
                                                      "arch": ("bert", "modernbert")},
                    objective="mlm_nsp", arch="bert")
  c = base_config()
  c.objective = v.objective
  c.data.generated = "context"
  # NSP's random B is told apart by its family more easily than by the order of languages.
  c.data.generated_families, c.data.generated_tokens = (2, 4) if v.objective == "mlm_nsp" else (1, 8)
  language = CycleLanguage(families=c.data.generated_families,
                           tokens_per_language=c.data.generated_tokens)
  c.model = model_config("bert-tiny", vocab_size=language.vocab_size,
                         max_position_embeddings=64, num_attention_heads=4,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  if v.arch == "modernbert":
    # A window of 11 positions either side in the 32-token rows: the local layers see about a
    # third of the row each way, and take the masked path (banded attention starts past three
    # half-windows), whose mask the checks' attention fault reaches.
    c.model = model_config("modernbert-tiny", vocab_size=language.vocab_size,
                           max_position_embeddings=64, num_attention_heads=4, pad_token_id=0,
                           local_attention=22)
  c.data.eval_documents = 200
  c.data.eval_batches = 8
  c.max_seq_length = 32
  c.max_predictions_per_seq = 5
  c.batch_size = 32
  c.learning_rate = 2e-3
  c.total_steps = 400
  c.optimizer.warmup_steps = 20
  c.log_every = 50
  c.eval_every = 50
  c.checkpoint_every = 400
  c.tensorboard = False
  c.masking.span_max = 3        # SpanBERT's spans, in a 32-token row
  c.masking.max_ngram = 2
  if v.objective == "mlm_sop":
    # SOP's negative is the same two segments swapped: mostly the step across [SEP] tells the
    # order (the next language; swapped, the language steps back by the pair's sentences less
    # one, which mod 4 languages reads as +1 when the pair holds 4 sentences). Of swapped pairs,
    # 40% read +1 in rows of 32 tokens, 21% in rows of 24 (2-3 sentences in 76% of pairs):
    # SOP 0.82-0.85 at step 300 here, chance on 2 of 3 draws at 32 (experiments/context_checks.md).
    c.max_seq_length = 24
    c.max_predictions_per_seq = 4
  if v.objective == "rtd":
    # The discriminator separates from always "original" by step ~500 at a lower, constant lr
    # with more replacements; at lr 2e-3 it stays at the prior for 1000 steps
    # (experiments/context_checks.md). Generator 1/2 wide, disc_weight 50 (base_config's).
    c.learning_rate = 5e-4
    c.optimizer.decay = "constant"
    c.masking.rate = 0.25
    c.max_predictions_per_seq = 8
    c.total_steps = 600
  if v.objective == "distill":
    c.distill = distill_settings()
    # A student from scratch, on the teacher's soft targets alone.
    c.distill.student_init = "scratch"
    c.distill.soft_weight, c.distill.hard_weight, c.distill.cosine_weight = 1.0, 0.0, 0.0
  return c

