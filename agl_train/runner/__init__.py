"""Rollout execution for the trainer: local subprocesses, Kubernetes Jobs, the dispatcher that
feeds them from the store's queue, the prompt groups a step trains on, the proxy's control
(pausing it for a weight update, publishing replicas: `proxy_control`) and the store's
retention of finished rollouts (`retention`). No torch, no verl.

The package exports nothing: import names from the modules that define them (`dispatch`,
`env`, `groups`, `local`, `k8s`, `outcome`, `proxy_control`, `retention`,
`runner_settings`). Every rollout process runs
`python -m agl_train.runner.launch`, which must not pay for the store's client and models
(seconds of CPU per rollout on a busy machine); an empty package keeps it that way.
"""
