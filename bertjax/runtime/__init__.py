"""The trainer's machinery beneath the models: checkpoints, sharding rules, the optimizer, frozen
parameters, divergence and preemption handling, metric writers, progress lines, prefetching,
profiling, XLA defaults, multi-host start, host memory, the workdir, the run's record and the step's
memory estimate. It imports only bertjax.core from the package."""
