#!/usr/bin/env bash
# Train the calculator agent on one GPU machine: start agl's proxy (with its embedded SQLite
# store on the same port), then the verl trainer, which registers its vLLM replicas with the
# proxy every step. Extra arguments go to train.py as key=value overrides, e.g.
#   examples/calc_agent/run.sh actor_rollout_ref.model.path=/models/Qwen2.5-0.5B-Instruct
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
PORT=${AGL_PORT:-8080}
export LITELLM_LOCAL_MODEL_COST_MAP=True PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

mkdir -p runs/calc_agent
printf 'model_list: []\n' > runs/calc_agent/models.yaml   # backends come from the trainer
"$PY" -m agl_store.cli proxy serve --config runs/calc_agent/models.yaml --port "$PORT" \
    --db runs/calc_agent/agl.db > runs/calc_agent/proxy.log 2>&1 &
PROXY_PID=$!
trap 'kill "$PROXY_PID" 2>/dev/null || true' EXIT
until curl -fsS "http://127.0.0.1:$PORT/health" > /dev/null 2>&1; do sleep 1; done

"$PY" examples/calc_agent/train.py "agentlightning.agl_base_url=http://127.0.0.1:$PORT" "$@"
