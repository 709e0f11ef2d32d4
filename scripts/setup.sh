#!/usr/bin/env bash
# Create .venv and install research-agent with pinned dependencies (CPU torch, offline default models).
# Usage: scripts/setup.sh [--test]   (--test adds pytest, hypothesis, FlagEmbedding and ruff)
# Re-running is instant unless pyproject.toml or constraints.txt changed.
#
# torch comes from the PyTorch CPU index when it answers: on Linux, PyPI's torch is the CUDA build (several GB
# of nvidia-* wheels). Where that index is unreachable (an offline mirror, a firewall) the plain index pip is
# configured with is used, and the script says which it chose on stderr.
#   SETUP_TORCH_INDEX          the CPU index (default https://download.pytorch.org/whl/cpu; empty: skip it)
#   SETUP_TORCH_PROBE_TIMEOUT  seconds the probe of that index may take (default 5)
# Sourcing this file (`source scripts/setup.sh`) defines the functions without running anything (tests).
set -euo pipefail

TORCH_VERSION=2.13.0
DEFAULT_TORCH_INDEX=https://download.pytorch.org/whl/cpu

# Prints "--index-url URL" when the CPU index answers within the timeout, nothing otherwise; says which on stderr.
# Why a probe: pip itself would wait PIP_DEFAULT_TIMEOUT (often 15-180 s) per retry, 5 retries, on a dead host.
torch_index_args() {
  local py=${1:-python3}
  local index=${SETUP_TORCH_INDEX-$DEFAULT_TORCH_INDEX}
  local timeout=${SETUP_TORCH_PROBE_TIMEOUT:-5}
  if [ -z "$index" ]; then
    echo "torch: SETUP_TORCH_INDEX is empty; installing torch from pip's configured index" >&2
    return 0
  fi
  if [ "$(uname -s)" != "Linux" ]; then
    echo "torch: $(uname -s): the plain index's torch is already the CPU build; using pip's configured index" >&2
    return 0
  fi
  if "$py" - "$index" "$timeout" <<'EOF' 2>/dev/null; then
import sys, urllib.request
url, timeout = sys.argv[1].rstrip("/") + "/torch/", float(sys.argv[2])
with urllib.request.urlopen(url, timeout=timeout) as response:
    sys.exit(0 if response.status < 400 and b"torch" in response.read(1 << 20) else 1)
EOF
    echo "torch: using the CPU index $index" >&2
    echo "--index-url $index"
  else
    echo "torch: the CPU index $index is not reachable (no answer within ${timeout}s); falling back to pip's configured index" \
         "(on Linux that may be the multi-GB CUDA build unless a local wheel is configured)" >&2
  fi
}

# The distribution was called research-agent before it became research-agent-kb (the PyPI name was taken); two
# distributions would both own the `research-agent` script.
remove_old_distribution() {
  if .venv/bin/python -m pip show research-agent >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall -y research-agent
  fi
}

main() {
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  local py=${PYTHON:-python3} extra="" stamp log index_args
  [ "${1:-}" = "--test" ] && extra="[test]"
  stamp=".venv/.installed${extra}-$(cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)"
  [ -f "$stamp" ] && return 0
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  log=.venv/setup.log
  echo "Setting up .venv (first run: about 2 minutes; log in $log)" >&2
  index_args=$(torch_index_args .venv/bin/python)
  {
    .venv/bin/python -m pip install --upgrade pip
    # shellcheck disable=SC2086  # index_args is empty or two words
    .venv/bin/python -m pip install "torch==$TORCH_VERSION" $index_args
    remove_old_distribution
    .venv/bin/python -m pip install -c constraints.txt -e ".${extra}"
  } >"$log" 2>&1 || { tail -n 30 "$log" >&2; echo "setup failed; see $log" >&2; return 1; }
  touch "$stamp"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
