#!/bin/bash
set -euo pipefail
{ echo "$GREETING"; head -n 1 "$DATA_DIR/points.csv"; } > answer.txt
echo seen > "$DATA_DIR/seen.txt"  # COPY --chown gave the folder to this user
