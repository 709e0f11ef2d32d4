#!/usr/bin/env bash
# Quick start: set up, then ingest the bundled docs into the embedded default store and ask a question.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ra=.venv/bin/research-agent
$ra kb add-folder docs --collection sample-docs --recursive --create --type fundamental \
  --description "research-agent's own documentation"
$ra query "${1:-How do I connect Cursor to research-agent over MCP?}" --collections sample-docs --top-k 3
