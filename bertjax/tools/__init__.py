"""Command-line tools and reports: the benchmark (with its PyTorch twin, `--ablate`'s runs and
`--checkpoint_cost`), evaluation, embedding, run reports and their plots, the Hugging Face reference
run and multi-seed runs. They sit on top: nothing in the package imports them."""
