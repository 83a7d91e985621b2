"""agl's trainer on verl: the only part of agl_train that imports verl (through `_verl`).

`entry` (`run_ppo`, `python -m agl_train.verl_glue.entry`) builds `trainer.AglTrainer`, whose
steps (`step`, `schedule`) read rollouts, build rows with `core`, tensors and advantages with
`algo`, and hand verl a batch (`verl_batch`) and a loss (`verl_loss`). `config` checks agl's
keys in the Hydra config, `verl_config` the verl keys agl relies on; `workers`, `attention`
and `cpu_workers` set up verl's workers; `hooks` loads the user's hooks; `dataset` holds the
task inputs. The package exports nothing: import names from the modules.
"""
