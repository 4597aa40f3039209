#!/bin/bash
# The oracle: kuka-plan comes from the solver template's Debian package (its /usr merged with
# the host's), the layout from the template's files, Python from the harness environment.
set -euo pipefail
mkdir -p /workspace/output
kuka-plan /opt/kuka/stations.json > /workspace/output/plan.txt
python - <<'PY'
import json, os, pwd

stations = json.load(open("/opt/kuka/stations.json"))["stations"]
steps = open("/workspace/output/plan.txt").read().split()
json.dump(
    {"stations": stations, "steps": steps, "by": pwd.getpwuid(os.getuid()).pw_name},
    open("/workspace/output/plan.json", "w"),
)
PY
echo "scratch" > /workspace/notes.txt
