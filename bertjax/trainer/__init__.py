"""The trainer: `run_plan` plans a run once (the checked settings, mesh, rules, model, accumulation,
eval batch size, schedule) and `train` runs it (sharded state, the jitted step, accumulation,
evaluation, checkpoints, metrics); `eval_context` makes the jitted metric and predict steps its
evaluators (bertjax/evaluators/) are built with. Entry points and pruning call it; evaluators,
objectives and tasks never import it."""
