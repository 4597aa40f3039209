#!/bin/bash
# Runs as the Dockerfile's USER (task.toml names no verifier user), in its WORKDIR, with its
# ENV and the files it COPYs (--chown: to that user). reward.json: one key per step, all 1.0
# when each was applied.
python - <<'PY'
import json, os, pwd

ranges = [line.split() for line in open("/proc/self/uid_map").read().splitlines()]
one_id = len(ranges) == 1 and ranges[0][2] == "1"
me = pwd.getpwuid(os.getuid()).pw_name
def read(path):
    try:
        return open(path).read()
    except OSError as exc:
        return f"<{exc}>"
checks = {
    "env": float(os.environ.get("GREETING") == "hello from the image" and os.environ.get("DATA_DIR") == "/srv/data"),
    "workdir": float(os.getcwd() == "/srv/work" and os.path.isdir("/srv/cache")),
    "copy": float(read("/srv/data/points.csv") == "x,y\n1,2\n" and read("/srv/work/notes.txt") == "copied next to the work\n"),
    "chown": float(pwd.getpwuid(os.stat("/srv/data/points.csv").st_uid).pw_name == me and read("/srv/data/seen.txt") == "seen\n"),
    # Where the sandbox's namespace holds one id, every command runs as its root (recorded).
    "user": float(me == "solver" or (one_id and os.getuid() == 0)),
    "answer": float(read("/srv/work/answer.txt") == "hello from the image\nx,y\n"),
}
json.dump({"reward": min(checks.values()), **checks}, open("/logs/verifier/reward.json", "w"))
print("user:", me, "one id:", one_id, "cwd:", os.getcwd(), checks)
PY
