#!/usr/bin/env bash
# Does `pip install -e .[train,proxy]` on top of requirements/gpu.txt change anything that file installed?
#
# pip's resolver in a throwaway venv, as a dry run (package metadata only: nothing is installed, no GPU
# needed): it resolves requirements/gpu.txt alone, then requirements/gpu.txt with agl, and compares the two.
# Exit 0 when the only difference is agl itself. Needs the package index; takes a few minutes.
#
#   scripts/check_gpu_install.sh            (PYTHON=python3.11 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"${PYTHON:-python3.11}" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip install --dry-run --ignore-installed --quiet)
"${pip[@]}" --report "$work/stack.json" -r requirements/gpu.txt
"${pip[@]}" --report "$work/with_agl.json" -r requirements/gpu.txt -e ".[train,proxy]"
"$work/venv/bin/python" - "$work/stack.json" "$work/with_agl.json" <<'EOF'
import json
import sys


def resolved(path):
    with open(path) as handle:
        return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in json.load(handle)["install"]}


stack, with_agl = resolved(sys.argv[1]), resolved(sys.argv[2])
changed = {name: (stack.get(name), version) for name, version in with_agl.items() if stack.get(name) != version}
changed.pop("agl", None)
removed = sorted(set(stack) - set(with_agl))
print(f"requirements/gpu.txt resolves to {len(stack)} packages; with agl[train,proxy]: {len(with_agl)}")
for name, (before, after) in sorted(changed.items()):
    print(f"  changed by agl: {name} {before} -> {after}")
for name in removed:
    print(f"  dropped with agl: {name} {stack[name]}")
sys.exit(1 if changed or removed else 0)
EOF
