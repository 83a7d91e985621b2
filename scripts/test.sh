#!/usr/bin/env bash
# Run agl's tests from nothing: scripts/setup.sh (.venv with the pinned test requirements, the tiny model), then
# Chromium for the browser tests and the agent-lightning 0.3 peer venv, then the lint and type gates
# (scripts/check.sh), then pytest.
# Extra arguments go to one pytest run of what they select; without them the whole suite runs as two pytest processes
# side by side (below). The exit code is pytest's. Example: ./scripts/test.sh tests/store -x
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv

log() { echo "[$1] ${*:2}"; }

scripts/setup.sh

export LITELLM_LOCAL_MODEL_COST_MAP=True # LiteLLM fetches its cost map from the internet otherwise
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 # no model hub: everything is built locally
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false

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
if [ $# -gt 0 ]; then
    log test "running pytest"
    exec "$VENV/bin/python" -m pytest "${pytest_args[@]}" "$@"
fi

# The whole suite in two pytest processes side by side: the training runs (`-m training`: a trainer, its
# vLLM and its agents, mostly waiting on one another) and the rest. One process alone kept less than one of
# the two cores busy (20.5 CPU minutes in a 23.7-minute run); two keep both busy. Each has its own temporary
# folder and its own vLLM servers (the training runs use only theirs). The training runs' output follows the
# rest's; the exit code is the first failure's, and the last line sums both.
runs=$(mktemp -d "${TMPDIR:-/tmp}/agl-tests.XXXXXX")
log test "running pytest: the training runs (-m training) in a second process (output below, at the end), the rest here"
"$VENV/bin/python" -m pytest "${pytest_args[@]}" -m training --basetemp="$runs/training" \
    --junitxml="$runs/training.xml" tests/train >"$runs/training.log" 2>&1 &
training=$!
status=0
"$VENV/bin/python" -m pytest "${pytest_args[@]}" -m "not training" --basetemp="$runs/rest" \
    --junitxml="$runs/rest.xml" || status=$?
training_status=0
wait "$training" || training_status=$?
log test "the training runs (-m training):"
cat "$runs/training.log"
"$VENV/bin/python" - "$runs/rest.xml" "$runs/training.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET

counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
for path in sys.argv[1:]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        continue  # that process died before its report: its exit code says so
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    for key in counts:
        counts[key] += int(suite.get(key, 0)) if suite is not None else 0
failed = counts["failures"] + counts["errors"]
print(f"total: {counts['tests'] - failed - counts['skipped']} passed, {failed} failed, {counts['skipped']} skipped")
PY
rm -rf "$runs"
if [ "$status" -ne 0 ]; then exit "$status"; fi
exit "$training_status"
