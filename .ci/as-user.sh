#!/usr/bin/env bash
# CI, as an unprivileged user (DESIGN invariant 8: nothing needs root). Run by .ci/run when it
# runs as root; a regression that only root survives (a read-only directory moved between
# folders, a file only root can open) turns CI red here.
#
# As user $HARNESS_CI_USER (created when missing), in a home it owns:
#   1. a fresh copy of this checkout (the files git sees, uncommitted edits included);
#   2. the README's main job, `bash scripts/example.sh`, with its own venv and HARNESS_HOME, then
#      again with only the distribution's python3 on PATH in an empty home (a fresh machine);
#   3. a store shared by a lab: a second user in one group with the first reuses its paths;
#   4. the tests of the store, realize, the runtime and the caches with that venv
#      ($HARNESS_CI_USER_TESTS adds more test files or pytest arguments);
#   5. tests/test_harbor.py in a Python 3.12 venv of the user's (HARNESS_CI_USER_HARBOR=0: not).
# Tests that need root (a tmpfs mount, `unshare -n`, creating users) are marked `root` and skip
# there, saying so; .ci/run runs them as root.
#
# `--prepare` does, as root, what changes the machine (users, groups, their copies of the
# checkout and of root's interpreters); `--run` then runs the steps as the users and changes
# nothing outside their homes, so .ci/run runs it beside its own tests. No argument: both.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
user="${HARNESS_CI_USER:-harness-ci}"
# The test files this user runs. .ci/run runs them as root only for their tests marked
# `root` (`.ci/as-user.sh --list-tests` prints them), so nothing runs twice.
user_tests="tests/test_store.py tests/test_store_cli.py tests/test_store_hashing.py tests/test_realize.py \
tests/test_cache.py tests/test_build_env.py tests/test_broker.py tests/test_up_down.py tests/test_runs.py \
tests/test_shared_store.py tests/test_bad_input.py tests/test_home_paths.py tests/test_bytecode.py tests/test_progress.py \
tests/test_sdist_builds.py tests/test_launchcheck.py tests/test_lock_stamp.py tests/test_python_downloads.py \
tests/test_gc.py tests/test_git_sources.py tests/test_source_views.py tests/test_secrets.py tests/test_fresh_machine.py \
tests/test_remote_simulator.py tests/test_variants.py tests/test_logs.py tests/test_scoped_resets.py \
tests/test_guide_commands.py tests/test_device_check.py tests/test_webui.py tests/test_report.py tests/test_livelog.py \
tests/test_rootfs.py tests/test_variant_groups.py tests/test_wheel_variants.py"
if [ "${1:-}" = --list-tests ]; then echo $user_tests; exit 0; fi
steps="${1:-all}"
case "$steps" in --prepare|--run|all) ;; *) echo "ci: .ci/as-user.sh [--prepare|--run|--list-tests]" >&2; exit 2 ;; esac
# Each step's start, with the time since this script began.
phase() { printf 'ci: as-user [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }
[ "$(id -u)" = 0 ] || { echo "ci: .ci/as-user.sh needs root (it creates the user)" >&2; exit 2; }
lab="${user}-lab"; user2="${user}-2"
python_bin="${PYTHON:-python3}"

# 1. As root: the users, their group and their copies. The second member ($user2, group
#    $lab with $user) checks a lab's shared store in step 3.
prepare() {
  id -u "$user" >/dev/null 2>&1 || useradd -m -s /bin/bash "$user"
  # Harbor's task users need a subordinate id range (newuidmap); Debian's useradd usually adds one.
  grep -q "^$user:" /etc/subuid 2>/dev/null || usermod --add-subuids 200000-265535 --add-subgids 200000-265535 "$user"
  getent group "$lab" >/dev/null || groupadd "$lab"
  id -u "$user2" >/dev/null 2>&1 || useradd -m -s /bin/bash "$user2"
  usermod -aG "$lab" "$user"; usermod -aG "$lab" "$user2"
  local home work home2
  home="$(getent passwd "$user" | cut -d: -f6)"; work="$home/harness"
  home2="$(getent passwd "$user2" | cut -d: -f6)"
  chmod o+x "$home"  # the second member reaches the shared home (and the first's harness) in it
  # The user's own checkout: a fresh copy, owned by the user (the files git sees, uncommitted
  # edits included); the second member's, a copy of it.
  rm -rf "$work" "$home/harness-home"
  install -d -o "$user" -g "$(id -g "$user")" "$work"
  git -C "$src" ls-files -z --cached --others --exclude-standard \
    | tar -C "$src" --null -T - --ignore-failed-read -cf - 2>/dev/null \
    | runuser -u "$user" -- tar -C "$work" -xf -
  rm -rf "$home2/harness"; install -d -o "$user2" -g "$(id -g "$user2")" "$home2/harness"
  runuser -u "$user" -- tar -C "$work" --exclude=./.venv -cf - . | runuser -u "$user2" -- tar -C "$home2/harness" -xf -
  # The interpreters the committed locks pin, and a 3.12 for Harbor: where only root can run
  # them (root's pyenv), the user gets a copy in ~/.pyenv/versions, as a researcher would have.
  local versions
  versions="$(cd "$src" && "$python_bin" -c 'import pathlib, tomllib
print(" ".join(sorted({tomllib.loads(p.read_text())["python"]["version"] for p in pathlib.Path("locks").glob("*.lock.toml")})))' \
    2>/dev/null || true)"
  ( cd "$src" && [ -z "$versions" ] || "$python_bin" .ci/user_python.py "$home" $versions )
  if [ "${HARNESS_CI_USER_HARBOR:-1}" = 1 ]; then
    ( cd "$src" && "$python_bin" .ci/user_python.py "$home" "$(ls "${PYENV_ROOT:-/root/.pyenv}/versions" | grep '^3\.12' | tail -n 1)" ) || true
  fi
  [ ! -d "$home/.pyenv" ] || chown -R "$user:$(id -g "$user")" "$home/.pyenv"
}

if [ "$steps" != --run ]; then
  phase "prepare: users, group $lab, copies"
  prepare
  [ "$steps" = all ] || exit 0
fi
home="$(getent passwd "$user" | cut -d: -f6)"; work="$home/harness"
home2="$(getent passwd "$user2" | cut -d: -f6)"
[ -d "$work" ] && [ -d "$home2/harness" ] || { echo "ci: run .ci/as-user.sh --prepare first" >&2; exit 2; }

# What reaches the package registry for root reaches it for the user too.
passthrough=()
while IFS= read -r line; do passthrough+=("$line"); done < <(env | grep -E '^(PIP_|UV_|HTTPS?_PROXY=|NO_PROXY=|https?_proxy=|no_proxy=|SSL_CERT_|REQUESTS_CA_BUNDLE=)' || true)
user_python=""
for candidate in /usr/bin/python3 /usr/local/bin/python3 "$home"/.pyenv/versions/3.1[123]*/bin/python3; do
  if [ -x "$candidate" ] && runuser -u "$user" -- "$candidate" -c 'import venv' 2>/dev/null; then user_python="$candidate"; break; fi
done
[ -n "$user_python" ] || { echo "ci: no Python the user $user can run" >&2; exit 1; }

as_user() {
  runuser -u "$user" -- env -i HOME="$home" USER="$user" LOGNAME="$user" LANG=C.UTF-8 \
    PATH="$home/.local/bin:/usr/local/bin:/usr/bin:/bin" PYTHON="$user_python" \
    HARNESS_HOME="$home/harness-home" GIT_AUTHOR_NAME="harness ci" GIT_AUTHOR_EMAIL=ci@localhost \
    GIT_COMMITTER_NAME="harness ci" GIT_COMMITTER_EMAIL=ci@localhost "${passthrough[@]}" \
    bash -c "cd '$work' && $1"
}

# 2. The README's main job.
phase "the main job"
echo "ci: as $user (uid $(id -u "$user")): bash scripts/example.sh"
as_user "bash scripts/example.sh"

# 2b. The README's promise on a fresh machine (issue 35): the main job again with nothing but
#     the distribution's own python3 on PATH, a new HOME (no ~/.pyenv, an empty uv cache), a
#     new venv and an empty HARNESS_HOME. With Python downloads unreachable, the distribution's
#     3.11.x stands in for the lock's CPython, and the audit says so.
if [ -x /usr/bin/python3 ]; then
  phase "the main job on a fresh machine"
  fresh="$home/fresh-machine"
  rm -rf "$fresh"; install -d -o "$user" -g "$(id -g "$user")" "$fresh" "$fresh/home"
  echo "ci: as $user, with only /usr/bin/python3 ($(/usr/bin/python3 --version 2>&1)) and an empty home: bash scripts/example.sh"
  runuser -u "$user" -- env -i HOME="$fresh/home" USER="$user" LOGNAME="$user" LANG=C.UTF-8 PATH=/usr/bin:/bin \
    PYTHON=/usr/bin/python3 HARNESS_VENV="$fresh/venv" HARNESS_HOME="$fresh/home/harness-home" "${passthrough[@]}" \
    bash -c "cd '$work' && bash scripts/example.sh" | tail -n 8
  rm -rf "$fresh"
else
  echo "ci: no /usr/bin/python3: the main job did not run with the distribution's Python" >&2
fi

# 3. A lab's shared store: the first user makes the home of the main job a home group $lab
#    shares; a second member realizes the same locks (nothing is built or downloaded again),
#    runs the job from it, and cannot delete what the first registered.
phase "a shared store"
as_user ".venv/bin/harness store init --group '$lab'"
echo "ci: as $user2: realize, run and gc in the home $user shares with group $lab"
out="$(runuser -u "$user2" -- env -i HOME="$home2" PATH=/usr/bin:/bin LANG=C.UTF-8 HARNESS_HOME="$home/harness-home" \
  bash -c "umask 077 && cd '$home2/harness' && '$work/.venv/bin/harness' realize kinematics reach \
    && '$work/.venv/bin/harness' run --agent kinematics-only >/dev/null && '$work/.venv/bin/harness' store gc \
    && ! rm -rf '$home'/harness-home/store/*-kinematics-env 2>/dev/null")"
echo "$out"
[ "$(grep -c ': up to date' <<<"$out")" = 2 ] || { echo "ci: the second member built again" >&2; exit 1; }
as_user ".venv/bin/harness store verify --check-contents | tail -n 1"

# 4. The store, realize, runtime and cache tests (those marked `root` skip, saying why).
phase "tests"
echo "ci: as $user: pytest $user_tests ${HARNESS_CI_USER_TESTS:-}"
as_user ".venv/bin/python -m pytest -q -p no:randomly $user_tests ${HARNESS_CI_USER_TESTS:-}"

# 5. Harbor as the user (a 3.12 venv of the user's own); HARNESS_CI_USER_HARBOR=0 turns it off.
if [ "${HARNESS_CI_USER_HARBOR:-1}" = 1 ]; then
  phase "Harbor"
  py312="$(ls -d "$home"/.pyenv/versions/3.12*/bin/python3 /usr/bin/python3.12 2>/dev/null | head -n 1 || true)"
  if [ -n "$py312" ]; then
    as_user "'$py312' -m venv .venv-harbor && .venv-harbor/bin/python -m pip install --quiet -e '.[harbor,test]' \
      && .venv-harbor/bin/python -m pytest -q tests/test_harbor.py"
  else
    echo "ci: no Python 3.12 for $user: the Harbor tests did not run as the user" >&2
  fi
fi
phase "done"
