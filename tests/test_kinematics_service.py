"""The built-in CPU-only example: the kinematics service, run as a real process.

Every test talks HTTP to ``services/servers/serve_kinematics.py`` started with the robot
description shipped in the repository. The expected poses are computed here independently
(elementary DH matrices composed one by one, and the Panda's published home pose), never by
importing the server's own math.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.manifests.loading import load_model
from harness.manifests.model import ServiceManifest
from tests.ports import free_port

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "services" / "servers" / "serve_kinematics.py"
ROBOT = REPO / "services" / "assets" / "arm7" / "arm7.json"
DESCRIPTION = json.loads(ROBOT.read_text())
LOWER = np.array([j["lower"] for j in DESCRIPTION["joints"]])
UPPER = np.array([j["upper"] for j in DESCRIPTION["joints"]])
STARTUP_TIMEOUT_S = 15.0


# ---------------------------------------------------------------- independent kinematics


def rot_x(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[1, 0, 0, 0], [0, c, -s, 0], [0, s, c, 0], [0, 0, 0, 1]], dtype=float)


def rot_z(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s, 0, 0], [s, c, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=float)


def trans(x: float, y: float, z: float) -> np.ndarray:
    out = np.eye(4)
    out[:3, 3] = (x, y, z)
    return out


def reference_fk(q: np.ndarray) -> np.ndarray:
    """Craig's modified DH, link by link: RotX(alpha) TransX(a) RotZ(theta) TransZ(d).

    The shipped description's tool is the identity, so the flange is the end.
    """
    assert DESCRIPTION["tool"] == {"xyz": [0.0, 0.0, 0.0], "rpy": [0.0, 0.0, 0.0]}
    pose = np.eye(4)
    for joint, angle in zip(DESCRIPTION["joints"], q, strict=True):
        pose = (
            pose
            @ rot_x(joint["alpha"])
            @ trans(joint["a"], 0, 0)
            @ rot_z(angle + joint["offset"])
            @ trans(0, 0, joint["d"])
        )
    flange = DESCRIPTION["flange"]
    return pose @ rot_x(flange["alpha"]) @ trans(flange["a"], 0, 0) @ rot_z(flange["theta"]) @ trans(0, 0, flange["d"])


def quat_to_matrix(quat: list[float]) -> np.ndarray:
    w, x, y, z = np.asarray(quat) / np.linalg.norm(quat)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def rotation_angle(a: np.ndarray, b: np.ndarray) -> float:
    """Angle in radians of the rotation taking ``b`` to ``a``."""
    cosine = (np.trace(a @ b.T) - 1.0) / 2.0
    return math.acos(max(-1.0, min(1.0, cosine)))


# ---------------------------------------------------------------- the real server


@dataclass
class Server:
    process: subprocess.Popen[str]
    port: int
    banner: str

    def request(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
        """One request on a fresh connection; returns (status, decoded JSON body)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            return send(connection, method, path, body, raw)
        finally:
            connection.close()


def send(
    connection: http.client.HTTPConnection, method: str, path: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    headers = {"Content-Type": "application/json"} if data is not None else {}
    connection.request(method, path, body=data, headers=headers)
    response = connection.getresponse()
    payload = response.read()
    assert response.getheader("Content-Type") == "application/json"
    return response.status, json.loads(payload)


def start_server(port: int, log: Path, robot: Path = ROBOT) -> Server:
    """Start the script with ``sys.executable`` and wait until /health answers."""
    process = subprocess.Popen(
        [sys.executable, "-u", str(SCRIPT), "--robot", str(robot), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
        cwd=REPO,
    )
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise AssertionError(f"server exited {process.returncode}: {log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                pass
            break
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise AssertionError(f"server did not listen within {STARTUP_TIMEOUT_S} s") from None
            time.sleep(0.05)
    # The banner is printed (and flushed) before serving, so it is there once the port is.
    assert process.stdout is not None
    server = Server(process, port, process.stdout.readline().rstrip("\n"))
    status, health = server.request("GET", "/health")
    assert status == 200, health
    return server


def stop_server(server: Server, sig: int = signal.SIGTERM) -> int:
    if server.process.poll() is None:
        server.process.send_signal(sig)
    try:
        return server.process.wait(timeout=10)
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("kinematics") / "stderr.log"
    running = start_server(free_port(), log)
    yield running
    assert stop_server(running) == 0, log.read_text()


# ---------------------------------------------------------------- tests


def test_banner_health_and_info(server: Server) -> None:
    assert server.banner == f"kinematics: serving panda on http://127.0.0.1:{server.port}"
    assert server.request("GET", "/health") == (200, {"status": "ok", "robot": "panda", "dof": 7})
    status, info = server.request("GET", "/info")
    assert status == 200
    assert info["robot"] == "panda" and info["dof"] == 7
    assert [j["name"] for j in info["joints"]] == [f"panda_joint{i}" for i in range(1, 8)]
    assert [j["lower"] for j in info["joints"]] == LOWER.tolist()
    assert [j["upper"] for j in info["joints"]] == UPPER.tolist()
    assert "frankaemika" in info["source"]


def test_fk_home_pose_is_the_published_one(server: Server) -> None:
    # At q = 0 the Panda's flange is 0.088 m forward and 0.333+0.316+0.384-0.107 = 0.926 m
    # up, pointing down: rotated by pi about the base's x axis.
    status, answer = server.request("POST", "/fk", {"joints": [0] * 7})
    assert status == 200, answer
    assert answer["position"] == pytest.approx([0.088, 0.0, 0.926], abs=1e-12)
    assert np.allclose(answer["orientation"]["matrix"], np.diag([1.0, -1.0, -1.0]), atol=1e-12)
    quat = np.array(answer["orientation"]["quaternion"])
    assert abs(abs(quat @ [0.0, 1.0, 0.0, 0.0]) - 1.0) < 1e-12
    assert answer["within_limits"] is False  # joint 4's range excludes 0


def test_fk_matches_dh_transforms_composed_here(server: Server) -> None:
    rng = np.random.default_rng(7)
    for q in [np.zeros(7), *rng.uniform(LOWER, UPPER, size=(20, 7))]:
        status, answer = server.request("POST", "/fk", {"joints": q.tolist()})
        assert status == 200, answer
        expected = reference_fk(q)
        assert np.allclose(answer["position"], expected[:3, 3], atol=1e-12)
        assert np.allclose(answer["orientation"]["matrix"], expected[:3, :3], atol=1e-12)
        assert rotation_angle(quat_to_matrix(answer["orientation"]["quaternion"]), expected[:3, :3]) < 1e-7


def test_ik_round_trip(server: Server) -> None:
    """FK -> IK from a different seed -> FK reaches the target within 1 mm (and 1e-3 rad)."""
    rng = np.random.default_rng(2024)
    targets = rng.uniform(LOWER, UPPER, size=(20, 7))
    seeds = rng.uniform(LOWER, UPPER, size=(20, 7))
    for index, (q, seed) in enumerate(zip(targets, seeds, strict=True)):
        _, pose = server.request("POST", "/fk", {"joints": q.tolist()})
        with_orientation = index % 2 == 0
        request: dict[str, Any] = {"position": pose["position"], "seed": seed.tolist()}
        if with_orientation:
            request["orientation"] = pose["orientation"]["quaternion"]
        status, answer = server.request("POST", "/ik", request)
        assert status == 200, answer
        assert answer["success"] is True, (index, answer)
        joints = np.array(answer["joints"])
        assert np.all(joints >= LOWER) and np.all(joints <= UPPER)
        reached = reference_fk(joints)
        assert np.linalg.norm(reached[:3, 3] - pose["position"]) < 1e-3
        assert answer["position_error"] < 1e-3
        if with_orientation:
            assert rotation_angle(reached[:3, :3], quat_to_matrix(pose["orientation"]["quaternion"])) < 1e-3
            assert answer["orientation_error"] < 1e-3
        else:
            assert answer["orientation_error"] is None


def test_ik_accepts_fk_orientation_object_and_is_deterministic(server: Server) -> None:
    _, pose = server.request("POST", "/fk", {"joints": [0.1, -0.5, 0.2, -2.0, 0.1, 1.6, 0.7]})
    request = {"position": pose["position"], "orientation": pose["orientation"]}
    first = server.request("POST", "/ik", request)
    second = server.request("POST", "/ik", request)
    assert first[0] == 200 and first[1]["success"] is True
    assert first == second


def test_unreachable_target_is_best_effort(server: Server) -> None:
    for extra in ({}, {"orientation": [1, 0, 0, 0]}):
        status, answer = server.request("POST", "/ik", {"position": [10.0, 0.0, 0.0], **extra})
        assert status == 200, answer
        assert answer["success"] is False
        # The Panda reaches about 0.86 m from its shoulder; the best effort points at the target.
        assert 8.5 < answer["position_error"] < 9.5
        joints = np.array(answer["joints"])
        assert joints.shape == (7,) and np.all(joints >= LOWER) and np.all(joints <= UPPER)
        assert answer["iterations"] >= 1


BAD_REQUESTS: list[tuple[str, str, bytes, int, str]] = [
    ("POST", "/fk", b"{not json", 400, "malformed JSON"),
    ("POST", "/fk", b"\xff\xfe", 400, "malformed JSON"),
    ("POST", "/fk", b"[1, 2]", 400, "must be an object"),
    ("POST", "/fk", b"{}", 400, "needs 'joints'"),
    ("POST", "/fk", b'{"joints": [0, 0, 0]}', 400, "7 numbers"),
    ("POST", "/fk", b'{"joints": "0000000"}', 400, "7 numbers"),
    ("POST", "/fk", b'{"joints": [0, 0, 0, "x", 0, 0, 0]}', 400, "joints[3]"),
    ("POST", "/fk", b'{"joints": [0, 0, 0, true, 0, 0, 0]}', 400, "joints[3]"),
    ("POST", "/fk", b'{"joints": [0, 0, 0, null, 0, 0, 0]}', 400, "joints[3]"),
    ("POST", "/fk", b'{"joints": [0, 0, 0, NaN, 0, 0, 0]}', 400, "finite"),
    ("POST", "/fk", b'{"joints": [0, 0, 0, 0, 0, 0, 0], "extra": 1}', 400, "unknown key 'extra'"),
    ("POST", "/ik", b'{"position": [1, 2]}', 400, "3 numbers"),
    ("POST", "/ik", b'{"position": [0.5, 0, 0.5], "orientation": [0, 0, 0, 0]}', 400, "non-zero"),
    ("POST", "/ik", b'{"position": [0.5, 0, 0.5], "orientation": [1, 0, 0]}', 400, "4 numbers"),
    ("POST", "/ik", b'{"position": [0.5, 0, 0.5], "seed": [0]}', 400, "seed"),
    ("POST", "/ik", b'{"position": [0.5, 0, 0.5], "tolerance": -1}', 400, "tolerance"),
    ("POST", "/ik", b'{"position": [0.5, 0, 0.5], "max_iterations": 0}', 400, "max_iterations"),
    ("POST", "/ik", b'{"position": [0.5, 0, 0.5], "max_iterations": 2.5}', 400, "max_iterations"),
    ("POST", "/nowhere", b"{}", 404, "no such path"),
    ("GET", "/nowhere", b"", 404, "no such path"),
    ("GET", "/fk", b"", 405, "POST"),
    ("DELETE", "/health", b"", 405, "not allowed"),
]


@pytest.mark.parametrize(("method", "path", "raw", "code", "message"), BAD_REQUESTS)
def test_bad_requests_get_json_errors(
    server: Server, method: str, path: str, raw: bytes, code: int, message: str
) -> None:
    status, answer = server.request(method, path, raw=raw if raw else None)
    assert status == code
    assert set(answer) == {"error"} and message in answer["error"]
    assert "Traceback" not in answer["error"]
    assert server.request("GET", "/health")[0] == 200


def test_errors_and_answers_share_one_keep_alive_connection(server: Server) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        assert send(connection, "POST", "/fk", raw=b"{oops")[0] == 400
        assert send(connection, "POST", "/fk", {"joints": [0] * 7})[0] == 200
        assert send(connection, "POST", "/ik", {"position": [0.4, 0.1, 0.5]})[1]["success"] is True
        assert send(connection, "GET", "/health")[1]["status"] == "ok"
    finally:
        connection.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_server_cleanly(tmp_path: Path, sig: int) -> None:
    running = start_server(free_port(), tmp_path / "stderr.log")
    assert running.request("POST", "/fk", {"joints": [0] * 7})[0] == 200
    assert stop_server(running, sig) == 0
    assert (tmp_path / "stderr.log").read_text() == ""


def run_to_exit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=30, cwd=REPO)


def test_missing_robot_file_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "arm.json"
    result = run_to_exit("--robot", str(missing), "--port", str(free_port()))
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"cannot load robot description: {missing}: no such file" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{ nope", "not valid JSON"),
        (json.dumps({**DESCRIPTION, "joints": []}), "joints must be a non-empty list"),
        (json.dumps({k: v for k, v in DESCRIPTION.items() if k != "flange"}), "lacks key 'flange'"),
        (
            json.dumps({**DESCRIPTION, "joints": [{**DESCRIPTION["joints"][0], "a": "x"}]}),
            "joints[0].a must be a number",
        ),
    ],
)
def test_malformed_robot_file_exits_2(tmp_path: Path, content: str, message: str) -> None:
    robot = tmp_path / "arm.json"
    robot.write_text(content)
    result = run_to_exit("--robot", str(robot), "--port", str(free_port()))
    assert result.returncode == 2
    assert message in result.stderr and str(robot) in result.stderr
    assert "Traceback" not in result.stderr


def test_manifest_ships_the_robot_through_weights() -> None:
    manifest = load_model(ServiceManifest, REPO / "services" / "kinematics.toml")
    assert manifest.kind == "kinematics" and manifest.vram_gb == 0 and manifest.health == "/health"
    [weights] = manifest.weights
    assert weights.provider == "path"
    # {weights}/<dir>/ is the realized copy of the path, so the command's file must be in it.
    robot_arg = manifest.command[manifest.command.index("--robot") + 1]
    assert robot_arg == "{weights}/" + weights.dir + "/arm7.json"
    assert (REPO / weights.location / "arm7.json") == ROBOT
    assert (REPO / manifest.command[2]) == SCRIPT
    assert os.path.getsize(ROBOT) < 16 * 1024
    assert re.fullmatch(r"numpy==\d+\.\d+\.\d+", manifest.environment.requirements[0])
