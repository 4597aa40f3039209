#!/bin/bash
# Runs as the verifier's user. reward.json: one key per property, all 1.0 when the sandbox
# behaved as Docker would with these users.
python - <<'PY'
import json, os

report = open("/app/agent-report.txt").read().splitlines()
answer = json.load(open("/app/answer.json"))
checks = {
    "answer": float(answer["answer"] == 338350 and answer["prefix"] == os.environ["HARNESS_ENVIRONMENT"]),
    "agent_is_not_root": float(report[0].startswith("id=") and not report[0].startswith("id=0:")
                               and "name=agent home=/home/agent" in report[0]),
    "agent_writes_workdir_and_logs": float("W /app" in report and "W /logs/agent" in report),
    "agent_cannot_write_verifier_tests_usr": float(all(f"R {d}" in report for d in
                                                      ("/logs/verifier", "/tests", "/solution", "/usr"))),
    "agent_cannot_chmod_verifier": float("chmod verifier: refused" in report),
    "verifier_user": float(os.getuid() not in (0, int(report[0].split("=")[1].split(":")[0]))
                           and os.environ.get("USER") == "checker"),
}
json.dump({"reward": min(checks.values()), **checks}, open("/logs/verifier/reward.json", "w"))
print(report)
PY
