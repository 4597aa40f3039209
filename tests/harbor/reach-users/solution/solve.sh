#!/bin/bash
# Runs as the agent's user: reports who it is and what it can write, then answers.
set -u
{
  echo "id=$(id -u):$(id -g) name=$(id -un) home=$HOME"
  for d in /app /logs/agent /logs/verifier /tests /solution /usr; do
    if touch "$d/.probe-$$" 2>/dev/null; then echo "W $d"; rm -f "$d/.probe-$$"; else echo "R $d"; fi
  done
  if chmod 777 /logs/verifier 2>/dev/null; then echo "chmod verifier: done"; else echo "chmod verifier: refused"; fi
  grep '^Max address space' /proc/self/limits | tr -s ' '
} > /app/agent-report.txt
touch /logs/agent/made-by-agent  # Harbor's root must be able to replace it (uploads)
python - <<'PY'
import json, platform, sys

answer = sum(i * i for i in range(1, 101))
with open("/app/answer.json", "w") as out:
    json.dump({"answer": answer, "python": platform.python_version(), "prefix": sys.prefix}, out)
PY
