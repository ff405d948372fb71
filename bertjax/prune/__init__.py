"""Pruning of fine-tuned encoders: attention heads and layers (structured, a smaller model) and
weights by magnitude (unstructured, kept at zero through fine-tuning).

By concern: `importance` (Michel et al.'s head scores), `select` (which heads and layers go),
`magnitude` (weights to a target sparsity), `folders` (a pruned model on disk), `session` (a
fine-tuned run opened: its task, dev set, evaluation and re-fine-tuning), `flow` (pruning in
steps), `table` (the report and plot), `__main__` (the command line). The parameter surgery
itself is `bertjax.models.pruning`.
"""
