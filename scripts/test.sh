#!/usr/bin/env bash
# Set up (with test extras) and run the whole test suite; .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
export HF_HUB_OFFLINE=1
exec .venv/bin/python -m pytest "$@"
