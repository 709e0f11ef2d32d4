#!/usr/bin/env bash
# Create .venv and install research-agent with pinned dependencies (CPU torch, offline default models).
# Usage: scripts/setup.sh [--test]   (--test adds pytest, hypothesis and FlagEmbedding)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extra=""
[ "${1:-}" = "--test" ] && extra="[test]"
stamp=".venv/.installed${extra}-$(cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # The CPU wheel; a bare `torch` would pull a multi-GB CUDA build.
  .venv/bin/python -m pip install --quiet torch==2.13.0
  .venv/bin/python -m pip install --quiet -c constraints.txt -e ".${extra}"
  touch "$stamp"
fi
