"""agl_train: from token-level spans to verl training rows, advantages and losses.

The package exports nothing: import names from the modules that define them. Importing the
package is free, so `agl store serve` can load the web view (`agl_train.view`) through an
entry point without paying for torch. torch is imported only by the modules that compute on
tensors (`advantage`, `tensorize`, `loss`, `dataset`, `cpu_workers`) and verl only through
`_verl` by its glue (`verl_batch`, `verl_loss`, `step`, `trainer`, `entry`, `workers`,
`cpu_workers`). The pure-Python data
path: `traces` (spans to calls), `aggregate` (calls to rows), `prefix_break`, `update_cap`.
See docs/training.md.
"""
