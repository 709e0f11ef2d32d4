#!/usr/bin/env bash
# Set up (with test extras), lint, and run the whole test suite; .ci/run calls exactly this.
# Arguments go to pytest. The lint (ruff, pinned in the test extra; rules in pyproject.toml [tool.ruff]) runs
# first and fails the run on any offence: `.venv/bin/ruff check --fix` fixes most of them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
.venv/bin/ruff check --no-cache .
export HF_HUB_OFFLINE=1
exec .venv/bin/python -m pytest "$@"
