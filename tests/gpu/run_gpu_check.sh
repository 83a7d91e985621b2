#!/usr/bin/env bash
# The GPU check of agl's verl trainer: a few real PPO steps on the tiny model with agl's default
# config (agl_train/config.yaml), agents as local subprocesses calling vLLM through agl's proxy:
# a tool-calling agent (the calculator) for STEPS steps with a checkpoint at the last, then two
# async steps that carry groups over, resumed from their first checkpoint under the same schedule
# (tests/gpu/gpu_check.py says what it asserts).
# Needs one NVIDIA GPU and a Python environment with the GPU stack of requirements/gpu.txt
# (PYTHON=path/to/python; the CPU-only .venv of the test machine cannot run it). Nothing is
# downloaded: the tiny model is built locally. Output (proxy log, training log, composed config,
# the file logger's metrics, the last step's checkpoint) goes to $OUT.
#   PYTHON=/opt/venv/bin/python STEPS=3 tests/gpu/run_gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-/tmp/agl-gpu-check}
STEPS=${STEPS:-3}
mkdir -p "$OUT"
export LITELLM_LOCAL_MODEL_COST_MAP=True TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export VERL_FILE_LOGGER_ROOT="$OUT"   # the default `file` logger writes $OUT/agl-gpu-check/<run>.jsonl

"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible'; print('gpu:', torch.cuda.get_device_name(0))"
"$PY" -c "from agl_train.verl_glue.attention import flash_attn_installed as f; print('attention:', 'flash_attention_2' if f() else 'sdpa')"
MODEL=$("$PY" -c "from examples.tiny_vllm.tiny_model import build, DEFAULT_DIR; print(build(DEFAULT_DIR))")
PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")

# The proxy starts with no backend: the trainer registers verl's vLLM replicas every step. With
# --logprobs the spans carry vLLM's logprobs, which training/rollout_probs_diff_max compares.
printf 'model_list: []\n' > "$OUT/models.yaml"
"$PY" -m agl_store.cli proxy serve --logprobs --config "$OUT/models.yaml" --port "$PORT" --db "$OUT/agl.db" > "$OUT/proxy.log" 2>&1 &
PROXY_PID=$!
trap 'kill "$PROXY_PID" 2>/dev/null || true; wait "$PROXY_PID" 2>/dev/null || true' EXIT
for _ in $(seq 1 60); do
    curl -fsS "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && break
    sleep 1
done
curl -fsS "http://127.0.0.1:$PORT/health" > /dev/null

"$PY" tests/gpu/gpu_check.py --model "$MODEL" --base-url "http://127.0.0.1:$PORT" --steps "$STEPS" --out "$OUT" 2>&1 | tee "$OUT/train.log"

# gpu_check.py fails (status 1, one FAILED line each) on a step without rollouts done, with a failed
# rollout, without the proxy drained, or with rollout_probs_diff_max beyond the bf16 tolerance.
test -f "$OUT/checkpoints/tools/global_step_$STEPS/agl_carried.json" || { echo "no checkpoint at step $STEPS" >&2; exit 1; }
"$PY" -c "
import json
steps = [json.loads(line) for line in open('$OUT/agl-gpu-check/tools.jsonl')]
assert any(s['step'] == $STEPS and 'val/reward_mean' in s['data'] for s in steps), 'no validation at the last step'
" || exit 1
echo "gpu check finished; logs in $OUT"
