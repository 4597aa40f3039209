"""One broker per node for the shards of a cluster run: one model load per node.

The first shard of a run to reach a node starts a broker there, in the node's home
(``$HARNESS_HOME/runs/<run id>/node/``: its ``broker.json``, token, logs and the services'
pid files), detached from the shard's process as ``harness up``'s is; every shard of the
run on that node — the first included — then joins it as a run joins ``harness up``'s
broker (``POST /runs``: a token of its own whose leases are watched for scoped resets, and
``/runs/end`` when it ends). Services start once per node and swap as on one machine.

The first shard parks the broker's process as it begins (:func:`park_broker`,
:mod:`harness.runtime.parking`): Python and the broker's imports, most of its start, run
beside the shard's proof of its targets and its preparation. A parked process starts
nothing and opens no port until :func:`join_node_broker` hands it the plan, which the shard
reaches only after the node's closure matched the head's and its launch check passed; a
shard refused before that ends it (:func:`unpark_broker`).

The services' ports are chosen once per node and run (``ports.json`` beside the broker,
under a file lock), so every shard there launches the very same specs and the broker's
launch check (:meth:`harness.runtime.broker.SharedBroker.check_serves`) holds; the broker's
own port is kept there too (:data:`BROKER_PORT`), so every broker of the run on the node
serves at one address. A recorded port is used again only while it is free or held by the
run's own broker or services (:func:`node_ports`): ``--resume`` may find it taken.

Placement is the node's own: the broker is planned by the shard that starts it, from this
node's GPU inventory restricted to the devices the engine assigned to that shard
(``CUDA_VISIBLE_DEVICES`` from Ray or Slurm, narrowed, never overwritten).

When it stops: the broker shuts itself down :func:`linger_seconds` after its last joined
shard ended or died (:attr:`harness.runtime.broker.Broker.exit_unjoined`). Not at once when
the node's last running shard ends: with more shards than slots, the engine starts the
run's next shard on the node within a second or two of the previous one's end, and it
should find the models loaded; and not left to the deploy's idle rules, which stop only
``on_demand`` services, never the broker or a resident, so a node would keep a GPU loaded
for a run that is over. A shard killed with its node's worker is noticed by its pid, as a
run's that joined ``harness up``'s broker is. A cancelled shard that leaves no other shard
joined stops the broker at once (:func:`stop_if_unjoined`). On Ray the broker ends with the
run's job at the latest: Ray kills the processes its workers started when the job ends, and
the broker's watchdog (:mod:`harness.runtime.watchdog`) then stops its services.

On Slurm the broker cannot outlive the task of the shard that started it — process tracking
(a cgroup in production) ends every process of a task as the task ends, a normal end too —
and must not: its GPUs are that task's allocation. So that shard, its run over and its
result handed to the head (:func:`harness.runs.cluster.hand_over`: the head records it at
once), keeps its task while other shards of the run are joined to the broker
(:func:`hold_node_broker`, asking ``/status`` every :data:`WATCH_S`; the pure part is
:func:`still_joined`); shards that arrive meanwhile join and keep it too. SIGTERM (``scancel``,
the time limit) ends the wait at once; the joined shards then start the broker again as
below. Not on Ray, whose workers outlive their tasks (a worker's children end when the
worker exits: at the job's end, or a surplus idle worker, which the restart below covers),
where a waiting task would only hold the slot the run's next shard needs.

When it goes away under joined shards: the broker is a process of the engine's task of the
shard that started it (``started-by.json`` names that shard). On Slurm a ``scancel`` of that
task ends it — process tracking ends every process of a task, and on a real cluster it is a
cgroup, which no detaching escapes — while the node's other shards are joined. So each
joined shard watches the broker's process while its command runs (:class:`BrokerWatch`);
once it is gone, the first to take the node's lock starts a new broker for the run (same
port, same services from the same store paths on the same ports) and every one joins it
again with the token its command holds: the command's address and token answer again. The
shard's record lists each such restart and why (:func:`broker_gone_cause`: "the node's
broker, started by shard N, was cancelled with it"); a command whose call failed meanwhile
fails naming it; a starter that ended leaves ``ended.json`` (:data:`ENDED_FILE`), so a shard
that joined as it decided to end names it "ended with the task of shard N, which had
finished", and one cut by a signal while it waited "cancelled with it (SIGTERM while it kept
the broker …)". Where the run has scoped services, the shard also records an impurity
(:func:`lost_resets`): the resets the old broker saw went with it, so ``harness audit``
names the restart and ``--strict`` fails.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError, InputError

if TYPE_CHECKING:
    from harness.runtime.broker import SharedBroker
    from types import FrameType

    from harness.runtime.parking import Parked
    from harness.runtime.session import Prepared

#: How long a node's broker outlives its last joined shard, waiting for the run's next one
#: (``HARNESS_NODE_LINGER`` on the node sets another).
LINGER_S = 30.0

#: Tries to join a node's broker that is shutting itself down as the shard arrives.
_JOIN_TRIES = 5

PORTS_FILE = "ports.json"
#: The node's broker's own port in ``ports.json``: no service's name (those start with a
#: letter or digit), so every broker of the run on the node serves at the same URL.
BROKER_PORT = "(broker)"
#: Which shard started the node's broker (:func:`join_node_broker`), beside ``ports.json``.
STARTER_FILE = "started-by.json"
#: How often a joined shard looks whether its node's broker still runs (:class:`BrokerWatch`).
WATCH_S = 0.5
#: Tries to join again once the broker went away: its services may hold their ports for a
#: while (a task's processes get SIGTERM, then SIGKILL after Slurm's KillWait).
_REJOIN_TRIES = 20
#: How long the harness client in a shard's command waits for the node's broker started
#: again (``HARNESS_BROKER_WAIT``) before an acquire fails: the rejoin's tries and a load.
COMMAND_WAIT_S = 120.0
#: How long a shard whose node's broker went away waits for the shard that started it to
#: end too before it says whether the broker went with it (Slurm's default KillWait).
STARTER_WAIT_S = 30.0
#: What the shard that started the node's broker leaves in the node's state folder as its
#: task ends, on Slurm (:func:`hold_node_broker`): a broker gone after it is named as having
#: ended with a task that had finished, not as cancelled (:func:`broker_gone_cause`).
ENDED_FILE = "ended.json"

#: The broker process each node state folder's first shard started ahead (:func:`park_broker`),
#: until :func:`join_node_broker` hands it its plan or :func:`unpark_broker` ends it. A Ray
#: worker runs many tasks in one process: each shard takes or ends its own.
_parked: dict[Path, Parked] = {}


def node_state_dir(home: Path, run_id: str) -> Path:
    """The state folder of run ``run_id``'s broker on the node whose home is ``home``."""
    return home / "runs" / run_id / "node"


def node_ports(state_dir: Path, names: tuple[str, ...]) -> dict[str, int]:
    """The ports of the run's local ``names`` on this node: chosen by the first shard here
    (free ones now) and kept in ``ports.json``, read by every later one.

    A recorded port is kept only while it is free, or held by this run's own broker on the
    node or a service it started: ``--resume`` of a run days later finds ports that other
    processes may hold by then. Another's port is chosen again and the file rewritten, under
    its lock, so every shard of the run here reads the new one. Every shard after the node's
    first finds the ports held: while ``broker.json`` names a live broker (its pid with the
    start time it recorded), its port and those of the services it serves are trusted as its
    own (:func:`served_by_live_broker`, two small reads); only a port held otherwise is looked
    up among the node's TCP listeners (:func:`held_by_run`), which costs a scan of every
    process's open files."""
    from filelock import FileLock

    from harness.runtime.supervisor import make_state_dir, write_private

    make_state_dir(state_dir)
    with FileLock(str(state_dir / "ports.lock"), timeout=60, mode=0o600):
        path = state_dir / PORTS_FILE
        known: dict[str, int] = json.loads(path.read_text()) if path.is_file() else {}
        taken = [n for n in names if n in known and not port_free(int(known[n]))]
        if taken:  # the common case, a later shard: held by the run's live broker, trusted as is
            served = served_by_live_broker(state_dir, known)
            taken = [n for n in taken if int(known[n]) not in served]
        if taken:  # else who holds it: the connections are listed (costly where many processes run)
            ours = held_by_run(state_dir)
            taken = [n for n in taken if not listeners(int(known[n])) & ours]
        missing = [n for n in names if n not in known or n in taken]
        if missing:
            chosen = free_ports(len(missing), avoid={int(p) for n, p in known.items() if n not in missing})
            known.update(zip(missing, chosen, strict=False))
            write_private(path, json.dumps(known, sort_keys=True))  # 0600, as the rest of the folder
    return {n: int(known[n]) for n in names}


def served_by_live_broker(state_dir: Path, known: Mapping[str, int]) -> set[int]:
    """The ports the run's broker on this node serves, as its ``broker.json`` says, while
    its process lives (its pid with the start time it recorded: a pid the kernel gave
    another process since is not it): its own port and the ``known`` port of each service
    it serves. Empty when none runs."""
    from urllib.parse import urlsplit

    from harness.runtime.parking import names_live_process

    state = _read_json(state_dir / "broker.json")
    if not names_live_process(state):
        return set()
    try:
        ports = {int(urlsplit(str(state.get("url"))).port or 0)}
    except ValueError:
        ports = set()
    services = state.get("services")
    ports.update(int(known[n]) for n in (services if isinstance(services, list) else []) if n in known)
    return ports - {0}


def port_free(port: int) -> bool:
    """Whether a server could bind ``port`` on loopback now (as the broker and the services
    bind theirs: with ``SO_REUSEADDR``, so a port a closed server left in TIME_WAIT is free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def listeners(port: int) -> set[int]:
    """The pids of this user's processes listening on TCP ``port`` (another user's are not
    shown: they are never the run's)."""
    import psutil

    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.Error:
        return set()
    return {
        c.pid for c in connections if c.pid is not None and c.status == psutil.CONN_LISTEN and c.laddr[1:2] == (port,)
    }


def held_by_run(state_dir: Path) -> set[int]:
    """The pids of the run's own processes on this node: its live broker serving
    ``state_dir`` and what it started, and the services its pid files name (alive). Empty
    when none runs."""
    import psutil

    from harness.runtime.broker import read_state
    from harness.runtime.supervisor import read_pidfiles

    roots: set[int] = {r.pid for r in read_pidfiles(state_dir) if r.alive}
    state = read_state(state_dir)
    if state is not None:
        roots.add(int(state["pid"]))
    pids = set(roots)
    for pid in roots:
        try:
            pids.update(child.pid for child in psutil.Process(pid).children(recursive=True))
        except psutil.Error:
            continue
    return pids


def free_ports(count: int, avoid: set[int] | None = None) -> list[int]:
    """``count`` distinct TCP ports free on loopback now (the kernel picks them), none of
    ``avoid``."""
    sockets: list[socket.socket] = []
    chosen: list[int] = []
    try:
        while len(chosen) < count:  # each kept bound while the others are chosen: all distinct
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
            if sock.getsockname()[1] not in (avoid or set()):
                chosen.append(sock.getsockname()[1])
        return chosen
    finally:
        for sock in sockets:
            sock.close()


def park_broker(state_dir: Path) -> bool:
    """Start this node's broker process for the run ahead of its plan, when none serves
    ``state_dir`` yet (:func:`harness.runtime.parking.park`): its start-up overlaps the
    shard's proof and preparation. It starts nothing until :func:`join_node_broker` hands it
    the plan, after the closure was checked. Whether one was parked."""
    from harness.runtime.parking import park

    unpark_broker(state_dir)
    parked = park(state_dir)
    if parked is not None:
        _parked[state_dir] = parked
    return parked is not None


def unpark_broker(state_dir: Path) -> bool:
    """End the broker process parked for ``state_dir`` if :func:`join_node_broker` did not
    take it (a refused shard): it exits having started nothing. Whether there was one."""
    parked = _parked.pop(state_dir, None)
    if parked is not None:
        parked.discard()
    return parked is not None


def join_node_broker(
    state_dir: Path,
    prepared: Prepared,
    run: str,
    pid: int,
    timeout: float | None = None,
    *,
    token: str | None = None,
    tries: int = _JOIN_TRIES,
) -> tuple[SharedBroker, dict[str, str]]:
    """Join this node's broker for the run as ``run`` (process ``pid``), starting it if none
    serves ``state_dir`` (or the one there is ending itself), with the plan's resident
    services up, on the broker's port of ``ports.json`` (the same URL for every broker of the
    run here). Returns the broker and what the shard's command needs to reach it (a token of
    the shard's own: ``token``, the one its command holds, when it joins again). The shard
    that starts it is named in ``started-by.json``. Raises :class:`HarnessError` naming what
    did not come up."""
    from harness.runtime.broker import SharedBroker, spawn, start_failure
    from harness.runtime.session import broker_options

    # Its watchdog stops the services should the broker itself be killed: Ray kills the
    # processes its workers started (this broker among them) when the run's job ends.
    options: dict[str, float | bool] = {
        **broker_options(prepared.deploy),
        "exit_unjoined": linger_seconds(),
        "die_with_owner": True,
    }
    names = [p.name for p in prepared.plan.services if p.mode == "resident" and p.name in prepared.specs]
    last: HarnessError | None = None
    for attempt in range(tries):
        if SharedBroker.find(state_dir) is None:  # one may start: on the run's broker port here
            options["port"] = node_ports(state_dir, (BROKER_PORT,))[BROKER_PORT]
        try:
            status = spawn(
                prepared.plan,
                prepared.specs,
                state_dir,
                names=names,
                timeout=timeout,
                options=options,
                parked=_parked.pop(state_dir, None),
            )
        except HarnessError as exc:  # one ending itself as we came: its state goes, try again
            last = exc
            time.sleep(min(0.5 * (attempt + 1), 3.0))
            continue
        if status["broker"].get("up_errors"):  # a service that did not come up: no retry
            raise start_failure(status["broker"]["up_errors"], hint=f"the node's broker: {state_dir}")
        try:
            shared = SharedBroker.find(state_dir)
            if shared is not None:
                if status["broker"].get("spawned"):
                    _note_starter(state_dir, run, pid, shared.pid)
                shared.check_serves(prepared.specs, list(prepared.specs))
                return shared, shared.join_run(run, pid, token)
        except HarnessError as exc:
            last = exc
        time.sleep(min(0.5 * (attempt + 1), 3.0))
    raise HarnessError(
        f"cannot start or join the node's broker in {state_dir}" + (f": {last.message}" if last else ""),
        hint=f"its log: {state_dir / 'logs' / 'broker.log'}",
    )


def _note_starter(state_dir: Path, run: str, pid: int, broker_pid: int) -> None:
    """Name the shard that started the node's broker (``started-by.json``): a broker that
    goes away with that shard's task is told by it (:class:`BrokerWatch`)."""
    from harness.runtime.parking import process_identity
    from harness.runtime.supervisor import write_private

    write_private(
        state_dir / STARTER_FILE,
        json.dumps({"run": run, "pid": pid, "process": process_identity(pid), "broker_pid": broker_pid}),
    )


class BrokerWatch:
    """A joined shard's watch on its node's broker, while the shard's command runs.

    On Slurm, the broker is a process of the task of the shard that started it: a
    ``scancel`` of that task ends it (a cgroup holds every process of a task; no detaching
    escapes it), and with it the services the node's other shards use (a task that ends
    normally waits for them first: :func:`hold_node_broker`). The watch looks at
    the broker's process every :data:`WATCH_S` seconds; once it is gone, the shard joins
    again (:func:`join_node_broker`): the first surviving shard there starts a new broker
    under the node's lock, on the same broker port and with the services on the same
    ``ports.json`` ports, from the same store paths; the others join it. Each keeps the
    token its command holds, so the command's ``HARNESS_BROKER`` and token still answer.
    :attr:`restarts` says what happened, for the shard's record."""

    def __init__(
        self, state_dir: Path, prepared: Prepared, run: str, pid: int, shared: SharedBroker, token: str
    ) -> None:
        import threading

        from harness.runtime.parking import process_identity

        self.state_dir, self.prepared, self.run, self.pid = state_dir, prepared, run, pid
        self.shared, self.token = shared, token
        self.restarts: list[dict[str, Any]] = []
        self._broker = process_identity(shared.pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="node-broker-watch", daemon=True)
        self._thread.start()

    def stop(self) -> SharedBroker:
        """Stop watching (the shard's command ended); the broker the shard is joined to now."""
        self._stop.set()
        self._thread.join(timeout=120)
        return self.shared

    def _loop(self) -> None:
        from harness.runtime.parking import names_live_process

        while not self._stop.wait(WATCH_S):
            if not names_live_process(self._broker):
                self.restarts.append(self._rejoin())

    def _rejoin(self) -> dict[str, Any]:
        """Join the node's broker again, started anew here or by another surviving shard;
        what happened, as the record keeps it."""
        from harness.runtime.parking import process_identity

        gone = int(self._broker["pid"])
        starter = _read_json(self.state_dir / STARTER_FILE)
        event: dict[str, Any] = {"at": time.time(), "gone_pid": gone, "started_by": starter.get("run")}
        try:
            self.shared, _ = join_node_broker(
                self.state_dir, self.prepared, self.run, self.pid, token=self.token, tries=_REJOIN_TRIES
            )
        except HarnessError as exc:
            self._stop.set()  # nothing more to watch: the command's calls fail, the record says why
            event["error"] = exc.message
        else:
            self._broker = process_identity(self.shared.pid)
            event.update(new_pid=self.shared.pid, restarted_by=_read_json(self.state_dir / STARTER_FILE).get("run"))
        # A cancelled task's processes get SIGTERM at once and SIGKILL after Slurm's KillWait:
        # the shard that started the broker may outlive it by that long (submitit's runner
        # ignores SIGTERM). Asked once the services are back, so the wait costs no episode.
        if starter.get("run") != self.run:
            _wait_gone(starter.get("process"), STARTER_WAIT_S)
        ended = _read_json(self.state_dir / ENDED_FILE)
        event["cause"] = cause = broker_gone_cause(gone, starter, self.run, ended)
        if "error" in event:
            event["reason"] = f"{cause}; no new one could be started: {event['error']}"
        else:
            by = "this shard" if event["restarted_by"] == self.run else event["restarted_by"] or "another shard"
            event["reason"] = f"{cause}; {by} started a new one (pid {event['new_pid']}) on the same ports"
        return event


def lost_resets(restarts: list[dict[str, Any]], scoped: list[str]) -> list[str]:
    """The impurities of a shard that stayed joined while its node's broker went away
    (``restarts``: :attr:`BrokerWatch.restarts`), given the run's ``scoped`` services: the
    resets the old broker had seen in the shard's leases went with it (a broker keeps them
    in memory until the shard ends), and the services it ran started again, a scoped one
    with its memory empty, which the new broker, knowing no earlier lease, cannot call a
    reset. Nothing is lost where the run has no scoped service. Pure."""
    if not scoped:
        return []
    lines = []
    for restart in restarts:
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(restart.get("at") or 0)))
        lines.append(
            f"scoped resets of {', '.join(sorted(scoped))} unknown until {at}: {restart.get('reason')}; "
            "the resets the old broker saw in this shard's leases went with it, and a scoped service "
            "started again there with its memory empty"
        )
    return lines


def _wait_gone(identity: object, seconds: float) -> None:
    """Wait at most ``seconds`` for the process ``identity`` names to end."""
    from harness.runtime.parking import names_live_process

    deadline = time.monotonic() + seconds
    while names_live_process(identity) and time.monotonic() < deadline:
        time.sleep(0.2)


def broker_gone_cause(pid: int, starter: Mapping[str, Any], run: str, ended: Mapping[str, Any] | None = None) -> str:
    """Why the node's broker (process ``pid``) is gone, as far as its ``started-by.json``
    (``starter``) and the starter's ``ended.json`` (``ended``, :func:`hold_node_broker`) tell:
    ended with the task of the shard that started it — which had finished (its marker says
    so), or was cancelled (none, or one saying a signal cut its wait) — or died itself.
    Pure but for asking whether the starter's process lives."""
    from harness.runtime.parking import names_live_process

    who = starter.get("run") if starter.get("broker_pid") == pid else None
    if who is None:
        return f"the node's broker (pid {pid}) is gone"
    if who == run:
        return f"the node's broker (pid {pid}), started by this shard, is gone"
    if names_live_process(starter.get("process")):
        return f"the node's broker (pid {pid}), started by {who}, is gone while {who} still runs"
    ended = ended or {}
    if ended.get("run") == who and ended.get("broker_pid") == pid and ended.get("pid") == starter.get("pid"):
        if ended.get("finished"):
            return f"the node's broker (pid {pid}), started by {who}, ended with the task of {who}, which had finished"
        return (
            f"the node's broker (pid {pid}), started by {who}, was cancelled with it "
            f"({ended.get('signal') or 'a signal'} while it kept the broker for other shards)"
        )
    return f"the node's broker (pid {pid}), started by {who}, was cancelled with it"


def still_joined(runs: object, me: str) -> list[str]:
    """The runs (shards) joined to the node's broker other than ``me``, from its ``GET
    /status``'s ``broker.runs``; sorted, each once. Pure."""
    if not isinstance(runs, list):
        return []
    return sorted({str(r["run"]) for r in runs if isinstance(r, dict) and r.get("run") and r.get("run") != me})


def hold_node_broker(
    state_dir: Path, me: str, pid: int, *, before: Callable[[], None] | None = None, poll: float = WATCH_S
) -> dict[str, Any]:
    """On Slurm, the end of the task of the shard ``me`` (process ``pid``) whose own run is over
    and recorded: while it is the shard that started the node's live broker
    (``started-by.json``) and other shards of the run are joined to that broker, wait —
    asking the broker's ``/status`` every ``poll`` seconds — until none is: its task's end
    ends the broker on a Slurm whose process tracking is a cgroup, and with it the services
    they use. ``before`` is called once, when there is something to wait for (the shard hands
    its result to the head first: nothing of it is delayed). SIGTERM or SIGINT (``scancel``,
    the job's time limit) ends the wait at once; the joined shards then start the broker
    again (:class:`BrokerWatch`). The starter leaves ``ended.json`` in ``state_dir`` as it
    ends (whether or not it waited), so a shard that joined in the moment it decided to end
    names the cause (:func:`broker_gone_cause`). Returns what the shard's record keeps:
    ``held_broker_for`` (the shards it waited for), ``held_broker_s`` and, when a signal cut
    the wait, ``held_broker_stopped``; empty when it waited for none."""
    from harness.runtime.broker import SharedBroker

    began, held = time.monotonic(), set()
    with _signals_end_wait() as stopped:  # from the first moment: a scancel now is not lost
        starter = _read_json(state_dir / STARTER_FILE)
        if starter.get("run") != me or starter.get("pid") != pid:
            return {}  # not the starter of the node's broker (or another broker was started since)
        shared = SharedBroker.find(state_dir)
        if shared is None or shared.pid != starter.get("broker_pid"):
            return {}
        others = [] if stopped else _joined_others(shared, me)
        if others and before is not None:
            before()
        while others and not stopped:
            held.update(others)
            time.sleep(poll)  # a signal's handler runs meanwhile; the loop then sees it
            others = _joined_others(shared, me)
    _note_ended(state_dir, me, pid, shared.pid, stopped)
    if not held:
        return {}
    kept: dict[str, Any] = {"held_broker_for": sorted(held), "held_broker_s": round(time.monotonic() - began, 3)}
    if stopped:
        kept["held_broker_stopped"] = stopped[0]
    return kept


def _joined_others(shared: SharedBroker, me: str) -> list[str]:
    """The shards joined to ``shared`` other than ``me``; none when it no longer answers."""
    try:
        return still_joined(shared.request("GET", "/status").get("broker", {}).get("runs"), me)
    except HarnessError:
        return []


@contextmanager
def _signals_end_wait() -> Iterator[list[str]]:
    """SIGTERM and SIGINT noted (their names, in the list yielded) rather than acted on for the
    block, and SIGUSR2 (submitit's warning ahead of the time limit, whose handler would turn
    the shard's result into an error) ignored; the handlers before are restored after.
    Outside the main thread nothing can be noted: the block runs with the handlers as they are."""
    import signal

    seen: list[str] = []

    def note(signum: int, frame: FrameType | None) -> None:
        seen.append(signal.Signals(signum).name)

    wanted: dict[signal.Signals, Callable[[int, FrameType | None], None] | signal.Handlers] = {
        signal.SIGTERM: note,
        signal.SIGINT: note,
        signal.SIGUSR2: signal.SIG_IGN,
    }
    previous: dict[signal.Signals, Any] = {}
    try:
        for signum, handler in wanted.items():
            previous[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main thread
        pass
    try:
        yield seen
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _note_ended(state_dir: Path, me: str, pid: int, broker_pid: int, stopped: list[str]) -> None:
    """The starter's ``ended.json``: its task ends now, finished or cut by ``stopped``'s signal."""
    from harness.runtime.supervisor import write_private

    marker = {"run": me, "pid": pid, "broker_pid": broker_pid, "at": time.time(), "finished": not stopped}
    if stopped:
        marker["signal"] = stopped[0]
    try:
        write_private(state_dir / ENDED_FILE, json.dumps(marker, sort_keys=True))
    except OSError:
        pass  # only a later restart's cause is less precise


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def gpu_use(given: list[str] | None, launches: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Which of the GPUs a shard's engine gave it the node's broker runs services on.

    ``given``: the devices the shard's ``CUDA_VISIBLE_DEVICES`` names (its engine's
    assignment; None where the engine set none); ``launches``: the broker's ``GET /plan``,
    each service's recorded environment with the device it runs on. A later shard on a node
    uses the services the first one placed, on the first one's devices: the rest of what it
    was given stay ``idle``, and the record says so. Pure."""
    used: set[str] = set()
    for launch in launches.values():
        devices = str((launch.get("environment") or {}).get("CUDA_VISIBLE_DEVICES") or "")
        used.update(d.strip() for d in devices.split(",") if d.strip())
    mine = list(given or [])
    return {"given": mine, "used": sorted(used), "idle": [d for d in mine if d not in used]}


def linger_seconds() -> float:
    """How long this node's broker outlives its last joined shard: ``HARNESS_NODE_LINGER``
    (seconds, above zero) where the node's environment sets it, else :data:`LINGER_S`.
    Raises :class:`InputError` naming the variable for a value that is not such a number."""
    text = os.environ.get("HARNESS_NODE_LINGER", "").strip()
    if not text:
        return LINGER_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise InputError(
            f"HARNESS_NODE_LINGER={text!r} is not a number of seconds above zero",
            hint=f"unset it for the default ({LINGER_S:g} s), or give one such as 10",
        )
    return value


def stop_if_unjoined(shared: SharedBroker) -> bool:
    """Stop the node's broker now (and its services) when no shard is joined to it any more:
    a cancelled run's services must not wait out :data:`LINGER_S`. Whether it was stopped."""
    from harness.runtime.broker import down

    try:
        runs = shared.request("GET", "/status").get("broker", {}).get("runs")
    except HarnessError:
        return False  # it is gone already
    if runs:
        return False
    down(shared.state_dir)
    return True
