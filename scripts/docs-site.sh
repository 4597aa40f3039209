#!/usr/bin/env bash
# Build the documentation site (docs/, Starlight) and check it in headless Chromium:
# the generated reference is current, internal links resolve, every `harness …` snippet
# names real commands, and the home page and a guide render (screenshots kept in
# docs/dist/screenshots/). Needs Node.js >= 20.3 and npm; installs Debian's chromium when
# run as root without one (tests that need it skip, saying why, otherwise).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${HARNESS_VENV:-$root/.venv}"
[ -x "$venv/bin/python" ] || bash "$root/scripts/bootstrap.sh"
cd "$root/docs"
npm ci --no-audit --no-fund --loglevel=error
npm run build --silent
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || echo "docs: chromium not installed" >&2
fi
cd "$root"
HARNESS_DOCS_DIST="$root/docs/dist" HARNESS_DOCS_SCREENSHOTS="$root/docs/dist/screenshots" \
  "$venv/bin/python" -m pytest -q tests/test_docs.py
