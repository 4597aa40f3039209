#!/bin/bash
# Runs as the Dockerfile's USER (task.toml names no verifier user) in its WORKDIR. reward.json:
# one key per step, all 1.0 when each was applied.
python - <<'PY'
import json, os, pwd, shutil, subprocess

ranges = [line.split() for line in open("/proc/self/uid_map").read().splitlines()]
one_id = len(ranges) == 1 and ranges[0][2] == "1"
me = pwd.getpwuid(os.getuid()).pw_name
def read(path):
    try:
        return open(path).read()
    except OSError as exc:
        return f"<{exc}>"
def ok(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True).returncode == 0
tool = shutil.which("kuka-plan") or ""
plan = read("/workspace/plan.txt")
checks = {
    # kuka-plan (and kuka-common, its dependency) from the template's lock, on /usr
    "apt": float(tool == "/usr/bin/kuka-plan" and os.path.isfile("/usr/share/kuka/cells.txt")),
    "env": float(os.environ.get("PLAN_INPUT") == "/opt/cell/stations.json"),
    "workdir": float(os.getcwd() == "/workspace"),
    "copy": float(read("/opt/cell/stations.json") == '{"stations": ["KR-20-in", "KR-20-out"]}\n'),
    # Where the sandbox's namespace holds one id, every command runs as its root (recorded).
    "user": float(me == "agent" or (one_id and os.getuid() == 0)),
    # The template's user and the task's [agent] user are in the root's /etc/passwd and /etc/group.
    "users": float(ok("getent", "passwd", "agent") and ok("id", "agent") and ok("id", "operator")
                   and ok("getent", "group", "operator")),
    "answer": float(plan == "pick@KR-20-in handover place@KR-20-out\n"),
}
if not one_id and os.path.exists("/workspace/plan.txt"):  # the agent ran as [agent] user
    checks["answer"] *= float(pwd.getpwuid(os.stat("/workspace/plan.txt").st_uid).pw_name == "operator")
json.dump({"reward": min(checks.values()), **checks}, open("/logs/verifier/reward.json", "w"))
print("user:", me, "one id:", one_id, "cwd:", os.getcwd(), "passwd:", subprocess.run(
    ["getent", "passwd", "agent", "operator"], capture_output=True, text=True).stdout.split(), checks)
PY
