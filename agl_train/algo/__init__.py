"""The training math on tensors: torch, no verl.

`advantage` computes rollout-level advantages and spreads them over rows, `loss` is the
per-rollout loss, `tensorize` pads rows into the tensors verl's PPO reads. Built on `core`;
verl's side (`verl_glue`) calls them. The package exports nothing: import names from the modules.
"""
