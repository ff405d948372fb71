"""Knowledge distillation: a smaller student trained from a frozen teacher checkpoint.

Quick start on a CPU (the WikiText-2 sample shipped in the repo): pretrain a 4-layer teacher,
then distil a 2-layer student from it (DistilBERT's recipe), then distil on a GLUE task:

  python launch.py --config configs/quickstart.py --workdir runs/teacher \
      --config.objective=mlm --config.model.num_hidden_layers=4 --config.total_steps=1000
  python launch.py --config configs/distill.py:runlocal --workdir runs/student \
      --config.distill.teacher=runs/teacher
  python launch.py --config configs/glue.py:task=sst2,runlocal --workdir runs/sst2_teacher \
      --config.init_from=runs/teacher
  python launch.py --config configs/distill.py:task=sst2,runlocal --workdir runs/sst2_student \
      --config.distill.teacher=runs/sst2_teacher --config.init_from=runs/student

DistilBERT from bert-base (Sanh et al., 2019), on a corpus prepared with BERT's vocabulary
(from-hf reads a local folder: download the checkpoint first, which needs huggingface_hub):

  hf download bert-base-uncased --local-dir hf/bert-base-uncased
  python -m bertjax.convert from-hf --model-dir hf/bert-base-uncased \
      --workdir runs/bert-base-uncased
  python launch.py \
      --config configs/distill.py:student=distilbert --workdir runs/distilbert \
      --config.distill.teacher=runs/bert-base-uncased --config.data_dir=PREPARED

where PREPARED comes from `python -m bertjax.data.prepare ... --tokenizer runs/bert-base-uncased/
tokenizer`. Without data_dir, `data.corpus` is prepared with the teacher's tokenizer. No
environment variable is needed: the teacher sets JAX's `jax_use_simplified_jaxpr_constants`
(bertjax/objectives/teacher.py), so the frozen teacher's params reach the jitted step as sharded
arguments rather than 440 MB of constants compiled into it.

Variants:
  student=distilbert  6 layers of bert-base, initialized from teacher layers 0, 2, ..., 10; T=2;
                      loss 5.0 soft CE + 2.0 MLM + 1.0 cosine; batch 4096 (16 micro-batches),
                      lr 5e-4, 5% warmup, sequences of 512
  student=tinybert    TinyBERT-4 (4 layers, hidden 312, 12 heads) from scratch, general
                      distillation: hidden-state MSE through W_h + attention-score MSE over the
                      uniform layer map (student layer i <-> teacher layer 3i+2 of 12)
  task=<glue task>    task distillation (objective distill_glue): configs/glue.py's settings, the
                      teacher a workdir fine-tuned with it, loss 1.0 soft CE (T=2) + 1.0 hard;
                      TinyBERT's intermediate losses (--config.distill.hidden_weight=1.0
                      --config.distill.attention_weight=1.0 --config.distill.layer_map=uniform)
                      add the most in tests/test_distill.py's SST-2 run
  runlocal            tiny models on the WikiText-2 sample (or, with task=, the local GLUE copy)

Every setting is in `config.distill` (see bertjax/objectives/distill.py for the losses).

Which number to watch: `soft_kl`, T^2 * KL(teacher || student) at the masked positions, shown
after the loss on every line and the run's main metric. The loss barely moves (runlocal: about
173 throughout) because 5 x soft_ce includes 5 x T^2 x the teacher's entropy, about 160: a tiny
teacher's MLM distribution at T=2 is nearly flat over the 4000 pieces (8.0 nats; log 4000 = 8.3).
`agreement` (same argmax as the teacher) can fall while soft_kl falls. Measured with a 4-layer
teacher of 1000 steps on 64-token rows (MLM accuracy ~0.1): over runlocal's 200 steps soft_kl went
0.036 -> 0.017 (train rows) while agreement went 0.87 -> 0.27 (eval 0.92 at step 100, 0.27 at
200), swinging between 0.27 and 0.91 from one logged row to the next; the student's and the
teacher's MLM accuracy stayed level (about 0.1). Such a teacher's top choices are near ties, and
the hard MLM term (weight 2), whose gradient outweighs the soft term's against targets this flat,
keeps flipping the student's: with --config.distill.hard_weight=0 the same run's agreement rose
to 0.95 and soft_kl fell to 0.001. runlocal keeps DistilBERT's weights, chosen for a bert-base
teacher; watch soft_kl, or set hard_weight=0 to see the student track the teacher.
"""

import ml_collections

from bertjax.tasks.glue import TASKS
from configs import glue as glue_config
from configs.common import LOCAL_MODEL, base_config, choose, model_config, parse_variant, runlocal


def distill_settings() -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.teacher = ""                  # a training workdir or a converted checkpoint folder (required)
  d.student_init = "teacher_layers"  # teacher_layers | scratch
  d.init_layers = ""              # teacher layers copied into student layers 0, 1, ...: "0,2,4";
                                  # empty: evenly spread from the bottom (12 -> 6: 0, 2, ..., 10)
  d.temperature = 2.0             # softmax temperature T of the soft targets (loss scaled by T^2)
  d.soft_weight = 5.0             # T^2 * CE(teacher, student) on the MLM distribution / task logits
  d.hard_weight = 2.0             # the student's own loss on the true labels (MLM / task)
  d.cosine_weight = 1.0           # 1 - cos(student, teacher) of the last hidden states
  d.hidden_weight = 0.0           # TinyBERT: MSE(student hidden @ W_h, teacher hidden), per pair
  d.attention_weight = 0.0        # TinyBERT: MSE of the pre-softmax attention scores, per pair
  d.layer_map = ""                # "0:1,1:3,2:5" (student:teacher, 0-based) | uniform | empty
  return d


# Student shapes: (preset, overrides, student_init, layer_map, soft, hard, cosine, hidden, attn).
STUDENTS = {
    "distilbert": ("bert-base", {"num_hidden_layers": 6}, "teacher_layers", "",
                   5.0, 2.0, 1.0, 0.0, 0.0),
    "tinybert": ("bert-base", {"num_hidden_layers": 4, "hidden_size": 312,
                               "intermediate_size": 1200}, "scratch", "uniform",
                 0.0, 0.0, 0.0, 1.0, 1.0),
}


def get_config(arg=None):
  v = parse_variant(arg, "configs/distill.py", student="distilbert", task="", runlocal=False)
  if v.task:
    return _task_config(v)
  preset, overrides, init, layer_map, soft, hard, cosine, hidden, attention = choose(
      v.student, STUDENTS, "student")
  c = base_config()
  c.objective = "distill"
  c.model = model_config(preset, **overrides)
  c.distill = distill_settings()
  d = c.distill
  d.student_init, d.layer_map = init, layer_map
  d.soft_weight, d.hard_weight, d.cosine_weight = soft, hard, cosine
  d.hidden_weight, d.attention_weight = hidden, attention
  # DistilBERT: ~4k sequences per step (accumulated), lr 5e-4, 5% warmup, Adam without weight
  # decay, clipping at 5, full 512-token segments, no NSP. Set total_steps for your corpus.
  c.batch_size = 4096
  c.grad_accum_steps = 16
  c.learning_rate = 5e-4
  c.total_steps = 100_000
  c.max_seq_length = 512
  c.max_predictions_per_seq = 80
  c.optimizer.warmup_steps = -1
  c.optimizer.warmup_fraction = 0.05
  c.optimizer.weight_decay = 0.0
  c.optimizer.grad_clip_norm = 5.0
  c.log_every = 500
  c.checkpoint_every = 5000
  if v.runlocal:
    runlocal(c)
    # The teacher of the docstring's quickstart command: bert-tiny widths, 4 layers; the student
    # keeps 2 of them. Dropout off, as the tiny runs elsewhere.
    c.model = model_config(preset, **LOCAL_MODEL)
    if v.student == "tinybert":
      c.model = model_config(preset, **{**LOCAL_MODEL, "hidden_size": 64,
                                        "intermediate_size": 256})
    c.learning_rate = 1e-3
  return c


def _task_config(v) -> ml_collections.ConfigDict:
  """configs/glue.py's task, with objective distill_glue and the distill block."""
  c = glue_config.get_config(f"task={v.task}" + (",runlocal" if v.runlocal else ""))
  choose(v.task, {t: t for t in TASKS}, "GLUE task")
  c.objective = "distill_glue"
  c.distill = distill_settings()
  d = c.distill
  # The student starts from init_from (a distilled general student) when given, else from
  # scratch; teacher_layers is there for a student cut from the fine-tuned teacher itself.
  d.student_init = "scratch"
  d.soft_weight, d.hard_weight, d.cosine_weight = 1.0, 1.0, 0.0
  return c
