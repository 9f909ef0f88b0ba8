#!/usr/bin/env bash
# tests/run-all.sh - install what is missing, build, run every test (unit + integration
# against a throwaway PostgreSQL). Exit status non-zero when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh
make
make format-check
make check
