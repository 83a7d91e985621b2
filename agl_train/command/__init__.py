"""`agl train RUN.yaml`: one file names the agent, the tasks and the model; this runs the rest.

- `run_file`: the file read and checked before anything starts (the agent imports, its `env_map`
  fields are in the tasks); `tasks`: tasks from JSONL, Parquet, a list or a function; `errors`:
  `RunFileError`, naming the file and the field;
- `composed`: the trainer config the file asks for, the CPU's defaults apart, the batch sizes checked;
- `services`: vLLM on a copy of the model and `agl proxy serve`, as subprocesses; `preflight`: one
  rollout against the model before training;
- `steps`: one readable line per step, `step_warnings`: what a step line does not show, `run_store`:
  the rewards and the first failure read from the store, `curve`: the reward curve;
- `train`: the run itself (`train(config)`), `cli`: the `agl train` command.
"""
