#!/usr/bin/env bash
# agl's lint and type gates, which scripts/test.sh runs before pytest; any finding fails with a non-zero status.
#   ./scripts/check.sh         # ruff check, ruff format --check, then mypy (strict) on agl_store, agl_proxy, agl_train
#   ./scripts/check.sh DIR     # the same in DIR, by DIR's pyproject.toml (the tests run it on a scratch project)
# Needs the .venv that scripts/setup.sh makes. mypy takes about 20 s with a cold cache (.cache/mypy), 2 s warm.
set -euo pipefail
VENV="$(cd "$(dirname "$0")/.." && pwd)/.venv"
cd "${1:-$(dirname "$0")/..}"

log() { echo "[$1] ${*:2}"; }

log lint "ruff check and ruff format --check (pyproject.toml [tool.ruff])"
"$VENV/bin/ruff" check --quiet .
"$VENV/bin/ruff" format --check --quiet .

log types "mypy (pyproject.toml [tool.mypy])"
status=0
"$VENV/bin/python" -m mypy || status=$?
# Status 2 is mypy failing, not a finding: its incremental cache can trip over modules deleted since the last run.
if [ "$status" = 2 ]; then
    log types "mypy failed (status 2); again with an empty cache"
    rm -rf .cache/mypy
    "$VENV/bin/python" -m mypy
else
    exit "$status"
fi
