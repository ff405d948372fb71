"""The trainer: `run_plan` plans a run once (the checked settings, mesh, rules, model, accumulation,
eval batch size, schedule) and `train` runs it (sharded state, the jitted step, accumulation,
evaluation, checkpoints, metrics); `eval_context` is what an objective's evaluation is handed (the
jitted metric and predict steps, the model's inputs). Entry points and pruning call it; objectives
and tasks never import it."""
