"""Pretraining objectives, one module each; `bertjax.registry` maps `config.objective` to them."""
