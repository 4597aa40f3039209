#!/usr/bin/env bash
# The GPU check (scripts/device_check.py says what it checks): run it on a machine with an
# NVIDIA GPU and record what it prints in docs/benchmarks.md. CI never runs it: without a GPU
# it says there is nothing to check (--host runs the same flow on host memory).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${HARNESS_VENV:-$root/.venv}"
[ -x "$venv/bin/python" ] || bash "$root/scripts/bootstrap.sh"
exec "$venv/bin/python" "$root/scripts/device_check.py" "$@"
