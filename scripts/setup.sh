#!/usr/bin/env bash
# Create .venv and install research-agent with pinned dependencies (CPU torch, offline default models).
# Usage: scripts/setup.sh [--test]   (--test adds pytest, hypothesis, FlagEmbedding and ruff)
# Re-running is instant unless pyproject.toml or constraints.txt changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extra=""
[ "${1:-}" = "--test" ] && extra="[test]"
stamp=".venv/.installed${extra}-$(cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)"
[ -f "$stamp" ] && exit 0
[ -x .venv/bin/python ] || "$PY" -m venv .venv
log=.venv/setup.log
echo "Setting up .venv (first run: about 2 minutes; log in $log)" >&2
{
  .venv/bin/python -m pip install --upgrade pip
  # The CPU wheel; a bare `torch` would pull a multi-GB CUDA build.
  .venv/bin/python -m pip install torch==2.13.0
  .venv/bin/python -m pip install -c constraints.txt -e ".${extra}"
} >"$log" 2>&1 || { tail -n 30 "$log" >&2; echo "setup failed; see $log" >&2; exit 1; }
touch "$stamp"
