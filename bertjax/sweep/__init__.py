"""Hyperparameter sweeps from files: each point in its own process, resumable, local or remote.

  python launch.py --sweep experiments/quickstart_sweep.py --workdir runs/qs_sweep [--dry_run]
  python launch.py --sweep experiments/glue_bert_grid.py:task=rte --workdir runs/rte_grid \
      --config.init_from=runs/bert-base-uncased
  python -m bertjax.tools.report runs/qs_sweep

A sweep file defines `get_sweep(arg=None) -> dict` (`arg` is what follows `:` in the --sweep
spec, as for configs) with these keys:

  config   the base config spec, as given to --config (relative paths: from the repository root).
  fixed    {key: value} set on every point; not part of the point names.
  product  {key: [values]}: every combination (the last key varies fastest).
  points   [{key: value}, ...]: explicit points.

  search   a random or Bayesian search (optuna), and pruning: bertjax/sweep/search.py.
  command  a script run in launch.py's place, with its flags (default launch.py).

With only `product`, the points are its combinations; with only `points`, the list; with both,
each explicit point crossed with the product (e.g. objectives x seeds). Keys are config keys with
dots (`optimizer.b2`), values Python values. `--config.key=value` given with --sweep are added to
`fixed` (a swept key there is refused: the point names would lie), and a key both in `fixed` and
swept is refused too (one of the two would silently win). Every point's resolved config passes the
trainer's settings checks (bertjax/config/config_checks.py) before anything runs, --dry_run
included: an unknown key, a bad value or one out of its range fails naming the point.

Each point runs in DIR/<name>, its name made of its swept keys and values, sorted by key
(`learning_rate=0.001,seed=1`; characters outside `[A-Za-z0-9._+-]` become `_`; a tuple's
elements join with `x`), as `python launch.py --config C --workdir DIR/<name> --config.k=v ...`,
one after another (or --max_concurrent at once), its output appended to DIR/<name>/log.txt. A point is done when its
summary.json says "finished" at the config's total_steps: a re-run skips it. Any other point is
launched again, and the trainer resumes it from its latest checkpoint. A point that crashes is
recorded as failed with the last line of its log, and the sweep goes on. DIR/sweep.json holds
every point's overrides, status, command, last log line, runs and wall time; SIGTERM is passed
to the running point (which saves a checkpoint) and stops the sweep.

`--max_concurrent N` runs up to N points here at once, each on its own slice of the devices
(launchers.device_slices: its own CUDA_VISIBLE_DEVICES, TPU chips, or CPU cores with as many
faked CPU devices); the sweep's process only schedules and watches. A search draws each point as
a slot frees and reports each point's eval rows to its pruner; a pruned point gets SIGTERM, saves
and exits, and is recorded "pruned" (not run again); the finished sweep names its best point.

Remote runs (see experiments/README.md): `--tpu NAME --zone Z [--project P]` first packs this
repository, copies it to every worker of the Cloud TPU VM and installs it, then runs each point
on all workers at once through `gcloud compute tpus tpu-vm ssh --worker=all` with
`--config.distributed=True`. `--hosts h1,h2` does the same over plain ssh (rsync, then one process
per host), each process given JAX_COORDINATOR_ADDRESS (first host, port COORDINATOR_PORT),
JAX_NUM_PROCESSES and JAX_PROCESS_ID. The workdir is then a path on the hosts: a bucket
(`gs://...`, which every host and this machine reach) or a folder shared by all of them (NFS, a
bucket mounted with gcsfuse) at the same path as on this machine, so that skipping finished
points and the report see the results. On a bucket, each launch's output is added to the point's
log.txt when it ends (an object cannot be appended to). `--dry_run` prints every command.

By concern: `spec` (the sweep file, its points and their names), `search` (a search's sampler,
space, metric and pruner, through optuna), `launchers` (the command that runs a point here, on a
Cloud TPU VM or over ssh; device slices), `runner` (running them, DIR/sweep.json).
"""

from bertjax.sweep.runner import is_finished, last_line, run_sweep
from bertjax.sweep.spec import (MAX_NAME_LEN, Point, Sweep, expand_points, format_value, load_sweep,
                                load_sweep_spec, point_name)

__all__ = ["MAX_NAME_LEN", "Point", "Sweep", "expand_points", "format_value", "is_finished",
           "last_line", "load_sweep", "load_sweep_spec", "point_name", "run_sweep"]
