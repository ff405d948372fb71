"""Pruning in steps: score, remove, evaluate, fine-tune briefly, and again, to the target.

Structured (heads and/or layers): at step j of k the model keeps round(H * (1 - (1 - f) j / k))
of the original H heads (f = target fraction kept); the heads removed are the least important by
Michel et al.'s normalized scores, ranked over all layers, never a layer's last head. Layers
(when a layer target is given) go first within a step, the least important by the raw scores
of their heads. Unstructured: at step j the encoder layers' kernels are magnitude-pruned to
sparsity s j / k. Each step writes OUT/step_<j>/pruned (a converted folder) and, with
fine-tuning steps, OUT/step_<j>/finetuned (a training workdir) that the next step starts from.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from typing import Any

import jax
import numpy as np

from bertjax.core.errors import fail
from bertjax.models import pruning
from bertjax.models.config import ModelConfig
from bertjax.prune import folders, importance, magnitude, select
from bertjax.prune.session import Session


RANKINGS = ("importance", "random")


@dataclasses.dataclass(frozen=True)
class Plan:
  """What to prune to: fractions kept (heads, layers), sparsity, in `steps` steps."""
  target_heads: float = 1.0
  target_layers: float = 1.0
  target_sparsity: float = 0.0
  sparsity_scope: str = "global"
  steps: int = 1
  finetune_steps: int = 0
  ranking: str = "importance"  # "random": heads and layers drawn at random (a control)
  seed: int = 0

  def check(self) -> None:
    if not 0.0 < self.target_heads <= 1.0:
      fail(f"--target-heads {self.target_heads} must be a fraction of heads kept in (0, 1]")
    if not 0.0 < self.target_layers <= 1.0:
      fail(f"--target-layers {self.target_layers} must be a fraction of layers kept in (0, 1]")
    if not 0.0 <= self.target_sparsity < 1.0:
      fail(f"--target-sparsity {self.target_sparsity} must be in [0, 1)")
    if self.ranking not in RANKINGS:
      fail(f"unknown ranking {self.ranking!r}; use one of {', '.join(RANKINGS)}")
    if self.steps < 1 or self.finetune_steps < 0:
      fail("--steps must be >= 1 and --finetune-steps >= 0")
    if self.structured and self.target_sparsity > 0:
      fail("prune heads/layers or weights (--target-sparsity) in one command, not both; run "
           "the command again on the result for the other")
    if not self.structured and self.target_sparsity == 0:
      fail("nothing to prune; give --target-heads, --target-layers or --target-sparsity")

  @property
  def structured(self) -> bool:
    return self.target_heads < 1.0 or self.target_layers < 1.0

  def at(self, j: int, total: int) -> int:
    """Heads kept after step j of `steps`, of `total` at the start: the target reached linearly."""
    return int(round(total * (1 - (1 - self.target_heads) * j / self.steps)))


def encoder_of(params) -> Any:
  return params["encoder"] if "encoder" in params else params


def _row(j: int, cfg: ModelConfig, original: ModelConfig, params, pruned: dict, tuned: dict | None,
         metric: str, removed: Any) -> dict[str, Any]:
  enc = encoder_of(params)
  heads = pruning.count_heads(cfg)
  return {"step": j, "heads": heads, "heads_kept": heads / pruning.count_heads(original),
          "layers": cfg.num_hidden_layers, "sparsity": magnitude.sparsity_of(params),
          "encoder_params": int(sum(np.size(x) for x in jax.tree.leaves(enc))),
          "dev_pruned": pruned[metric], "dev_finetuned": tuned[metric] if tuned else None,
          "removed": removed}


def _structured_step(s: Session, plan: Plan, j: int, cfg: ModelConfig, params, original):
  """Removes this step's layers and heads; (params, config, what was removed)."""
  if plan.ranking == "random":  # the control: same schedule, scores drawn uniformly
    raw = np.random.default_rng([plan.seed, j]).random((cfg.num_hidden_layers,
                                                        cfg.num_attention_heads))
    raw[[[h not in cfg.kept_heads(i) for h in range(cfg.num_attention_heads)]
         for i in range(cfg.num_hidden_layers)]] = np.nan
  else:
    raw = importance.raw_importance(s.loss_fn(cfg), params, cfg, s.batches)
  if not np.nansum(raw) > 0:
    fail("every head's importance is zero: the task's loss on the scoring batches is zero "
         "(no labels?); this task cannot be pruned by importance")
  removed: dict[str, Any] = {"ranking": plan.ranking,
                             "scores": np.round(importance.normalize_per_layer(raw), 6).tolist()}
  layers_goal = int(round(original.num_hidden_layers * (1 - (1 - plan.target_layers) * j / plan.steps)))
  if cfg.num_hidden_layers > layers_goal:
    drop = select.layers_to_remove(raw, cfg, cfg.num_hidden_layers - layers_goal)
    params, cfg = pruning.remove_layers(params, cfg, drop)
    removed["layers"] = drop
    raw = np.delete(raw, drop, axis=0)
  heads_goal = plan.at(j, pruning.count_heads(original))
  excess = pruning.count_heads(cfg) - heads_goal
  if excess > 0:
    chosen = select.heads_to_remove(importance.normalize_per_layer(raw), cfg, excess)
    params, cfg = pruning.prune_heads(params, cfg, chosen)
    removed["heads"] = {str(k): v for k, v in sorted(chosen.items())}
  return params, cfg, removed


def run(s: Session, plan: Plan, params, tokenizer: pathlib.Path | None, overrides: list[str],
        log=print) -> list[dict[str, Any]]:
  """Runs `plan` on the session's model; one row per step (step 0: the model as given)."""
  plan.check()
  original = cfg = s.model_config()
  if plan.structured and cfg.scan_layers:
    fail("pruning heads needs unrolled layers; the run was trained with model.scan_layers=True")
  if plan.target_layers < 1.0 and cfg.architecture == "modernbert":
    fail("ModernBERT's layers attend globally or locally by their index, so removing one would "
         "change what the others compute; prune its heads only (--target-layers=1)")
  if plan.structured and plan.ranking == "importance":
    s.batches = s.importance_batches()
  base = s.evaluate(cfg, params, s.out / "step_0")
  rows = [_row(0, cfg, original, params, base, base, s.metric, None)]
  task = s.task_head(params)
  log(f"step 0: {pruning.count_heads(cfg)} heads, dev {s.metric} {base[s.metric]:.4f}")
  for j in range(1, plan.steps + 1):
    t0 = time.time()
    if plan.structured:
      params, cfg, removed = _structured_step(s, plan, j, cfg, params, original)
    else:
      params = magnitude.magnitude_prune(params, plan.target_sparsity * j / plan.steps,
                                         plan.sparsity_scope)
      removed = {"sparsity": plan.target_sparsity * j / plan.steps}
    where = s.out / f"step_{j}"
    folder = folders.save_pruned(where / "pruned", cfg, params, tokenizer, {"step": j, **removed},
                                 task)
    pruned = s.evaluate(cfg, params, where, step=j)
    tuned = None
    if plan.finetune_steps:
      summary, params = s.finetune(folder, where / "finetuned", plan.finetune_steps,
                                   not plan.structured, overrides)
      tuned = summary["last_eval"]
    rows.append(_row(j, cfg, original, params, pruned, tuned, s.metric, removed))
    r = rows[-1]
    log(f"step {j}: {r['heads']} heads ({100 * r['heads_kept']:.0f}%), {r['layers']} layers, "
        f"sparsity {r['sparsity']:.3f}: dev {s.metric} {r['dev_pruned']:.4f} pruned"
        + (f", {r['dev_finetuned']:.4f} after {plan.finetune_steps} steps" if tuned else "")
        + f" ({time.time() - t0:.0f} s)")
  return rows
