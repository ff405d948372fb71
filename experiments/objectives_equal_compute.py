"""Pretraining objectives at equal compute on one corpus: MLM+NSP, MLM, MLM+SOP, span+SBO, RTD.

  python launch.py --sweep experiments/objectives_equal_compute.py --workdir runs/objectives
  python -m bertjax.tools.report runs/objectives

Every point pretrains the quickstart model (bert-tiny) on the WikiText-2 sample with the same
batch, sequence length and learning rate schedule, 3 seeds each. Equal compute means equal
training FLOPs: the masked-LM objectives cost the same per step, so they share total_steps. RTD
(ELECTRA) also runs its generator, at generator_hidden_fraction f of the discriminator's width and
the same depth: about f^2 of the discriminator's FLOPs (width enters the matmuls squared), so RTD
gets STEPS / (1 + f^2) steps. Compare the points' dev mlm_accuracy / loss in the report (RTD's
dev metrics are its discriminator's and generator's, not directly comparable), or better,
fine-tune each on GLUE with experiments/glue_bert_grid.py and --config.init_from=<point dir>.
"""

STEPS = 300                   # the quickstart's total_steps
GENERATOR_FRACTION = 0.5      # configs/common.py's default: keeps bert-tiny's generator at 2 heads


def get_sweep():
  rtd_steps = round(STEPS / (1 + GENERATOR_FRACTION ** 2))
  return {
      "config": "configs/quickstart.py",
      "fixed": {"tensorboard": False},
      # total_steps per point (a key both fixed and swept is refused): RTD's differs.
      "points": [
          {"objective": "mlm_nsp", "total_steps": STEPS},
          {"objective": "mlm", "total_steps": STEPS},
          {"objective": "mlm_sop", "total_steps": STEPS},
          {"objective": "span_sbo", "total_steps": STEPS},
          {"objective": "rtd", "total_steps": rtd_steps,
           "electra.generator_hidden_fraction": GENERATOR_FRACTION},
      ],
      "product": {"seed": [0, 1, 2]},
  }
