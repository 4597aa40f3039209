#!/bin/bash
# Reward 1 when /app/answer.json is right and was computed by the environment's own Python
# (its sys.prefix is the realized store path harness names in HARNESS_ENVIRONMENT).
python - <<'PY'
import json, os, platform, sys

try:
    got = json.load(open("/app/answer.json"))
    ok = (got["answer"] == 338350 and got["python"] == platform.python_version()
          and got["prefix"] == os.environ["HARNESS_ENVIRONMENT"] == sys.prefix)
except (OSError, ValueError, KeyError) as exc:
    print("no valid answer:", exc)
    ok = False
print("answer:", "right" if ok else "wrong")
open("/logs/verifier/reward.txt", "w").write("1\n" if ok else "0\n")
PY
