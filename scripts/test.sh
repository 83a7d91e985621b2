#!/usr/bin/env bash
# Run agl's tests from nothing: scripts/setup.sh (.venv with the pinned test requirements, the tiny model), then
# Chromium for the browser tests and the agent-lightning 0.3 peer venv, then the lint and type gates
# (scripts/check.sh), then pytest.
# Extra arguments go to pytest; the exit code is pytest's. Example: ./scripts/test.sh tests/store -x
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv

log() { echo "[$1] ${*:2}"; }

scripts/setup.sh

export LITELLM_LOCAL_MODEL_COST_MAP=True # LiteLLM fetches its cost map from the internet otherwise
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 # no model hub: everything is built locally
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
# Every process of the run leaves the bytecode of what it imports (scripts/setup.sh compiles nothing ahead): the
# second vLLM start and every later one read it.
unset PYTHONDONTWRITEBYTECODE

# The view's browser tests drive Debian's chromium through playwright (never `playwright install`: it downloads).
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log setup "installing chromium for the browser tests (apt-get, a minute)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } ||
        log setup "chromium install failed: the browser tests in tests/view will skip"
fi

# agent-lightning 0.3 (pinned) in its own venv under .cache/peers/, as the benchmarks use it: its pins differ from
# ours. The compatibility test drives `agl store serve` with its client. Made once (a minute or two), then reused.
log setup "agent-lightning 0.3 peer venv (.cache/peers; made once, with the uv scripts/setup.sh installed)"
AGL_UV=$(ls .cache/uv/*/bin/uv 2>/dev/null | head -n 1) "$VENV/bin/python" benchmarks/_peers.py ||
    log setup "no peer venv: the agent-lightning 0.3 client test will skip (and fail under CI)"

# The lint and type gates (ruff, mypy): a finding fails the run before any test.
scripts/check.sh

pytest_args=(-q -p no:cacheprovider)
if [ -n "${CI:-}" ]; then
    pytest_args+=(--durations=15) # the slowest tests, to keep the CI run inside its time limit
fi
log test "running pytest"
exec "$VENV/bin/python" -m pytest "${pytest_args[@]}" "$@"
