#!/usr/bin/env bash
# The main job on the built-in example, end to end on any machine (no GPU, only the package
# registry): validate the project, check the committed locks, realize the kinematics service
# and the reach benchmark into the store, run the benchmark through the broker (each episode
# asks the kinematics service for inverse kinematics and checks it with forward kinematics),
# record the run, and audit the record.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
venv="${HARNESS_VENV:-$root/.venv}"
cd "$root"
harness="$venv/bin/harness"
step() { printf '\n== %s\n' "$*"; }

step "1. validate: every manifest, agent config and deploy"
"$harness" validate | tail -n 3
step "2. lock --check: the committed locks match their manifests"
"$harness" lock --check kinematics reach
step "3. realize: build exactly what the locks say into ${HARNESS_HOME:-~/.cache/harness}/store"
"$harness" realize kinematics reach
step "4. store verify --check-contents: every byte as registered"
"$harness" store verify --check-contents | tail -n 3
step "5. run: the kinematics-only agent on the reach benchmark, services through the broker"
"$harness" run --agent kinematics-only
step "6. audit: re-hash everything the run computed with"
"$harness" audit latest
step "summary"
"$harness" runs | head -n 6
step "next"
# The tour in the README uses a bare `harness`: say how to get it on PATH.
case ":$PATH:" in
  *":$venv/bin:"*) echo "harness is on your PATH: try \`harness services\` or \`harness plan\`" ;;
  *) echo "to type \`harness\` directly: source $venv/bin/activate   (or: export PATH=\"$venv/bin:\$PATH\")"
     echo "then try \`harness services\` (the manifests) or \`harness plan\` (where each service would run)" ;;
esac
