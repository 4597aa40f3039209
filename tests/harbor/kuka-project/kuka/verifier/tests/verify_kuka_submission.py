"""Grades /workspace/output/plan.json: native checks (0.8) and the probe (0.2), as KUKA's RewardKit."""

import json
import os
import pwd
import shutil
import subprocess

checks = {}
try:
    plan = json.load(open("/workspace/output/plan.json"))
except (OSError, ValueError) as exc:
    print("no plan:", exc)
    plan = {}
checks["stations"] = plan.get("stations") == ["KR-10-left", "KR-10-right"]
checks["steps"] = plan.get("steps") == ["pick@KR-10-left", "handover", "place@KR-10-right"]
# Both phases run as task user "agent": where the machine gives task users ids of their own the
# submission was made by "agent"; elsewhere both ran as the sandbox's one id.
checks["agent_user"] = plan.get("by") == pwd.getpwuid(os.getuid()).pw_name
checks["fresh_root"] = not os.path.exists("/opt/kuka") and shutil.which("kuka-plan") is None
checks["not_the_workspace"] = not os.path.exists("/workspace/notes.txt")
probe = subprocess.run(["kuka-probe", "/workspace/output/plan.txt"], capture_output=True, text=True)
checks["probe"] = probe.returncode == 0 and probe.stdout.strip() == "probe: 3 steps ok"
print("verifier runs as", pwd.getpwuid(os.getuid()).pw_name, json.dumps(checks, sort_keys=True))
native = 0.8 * all(checks[k] for k in ("stations", "steps", "agent_user", "fresh_root", "not_the_workspace"))
visual = 0.2 * checks["probe"]
json.dump(
    {"reward": round(native + visual, 6), "native": native, "probe": visual}, open("/logs/verifier/reward.json", "w")
)
