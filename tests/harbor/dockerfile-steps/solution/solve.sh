#!/bin/bash
set -euo pipefail
{ echo "$GREETING"; head -n 1 "$DATA_DIR/points.csv"; } > answer.txt
