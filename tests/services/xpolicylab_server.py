"""A stand-in for XPolicyLab's ``setup_policy_server.py``: the same command line, a tiny
policy served over WebSocket (RFC 6455, standard library only, so the service's own realized
environment needs no WebSocket package).

    python setup_policy_server.py --config_path policy/<Name>/deploy.yml --protocol ws
        --host H --port P --overrides k=v k=v ...

Loads ``deploy.yml`` (``key: value`` lines), applies the overrides (values read with
``ast.literal_eval`` where they parse, as XPolicyLab does), imports ``model.py`` beside
``deploy.yml`` and serves ``model.load(config)(observation)`` for each JSON text message.
Answers WebSocket pings with pongs and closes cleanly.
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import importlib.util
import json
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def read_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return data


def recv_frame(conn: socket.socket) -> tuple[int, bytes]:
    first, second = read_exact(conn, 2)
    length = second & 0x7F
    if length == 126:
        length = struct.unpack(">H", read_exact(conn, 2))[0]
    elif length == 127:
        length = struct.unpack(">Q", read_exact(conn, 8))[0]
    mask = read_exact(conn, 4) if second & 0x80 else b"\0\0\0\0"
    payload = read_exact(conn, length)
    return first & 0x0F, bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def send_frame(conn: socket.socket, opcode: int, payload: bytes) -> None:
    size = len(payload)
    if size < 126:
        header = bytes([0x80 | opcode, size])
    elif size < 1 << 16:
        header = bytes([0x80 | opcode, 126]) + struct.pack(">H", size)
    else:
        header = bytes([0x80 | opcode, 127]) + struct.pack(">Q", size)
    conn.sendall(header + payload)


def handshake(conn: socket.socket) -> None:
    request = b""
    while b"\r\n\r\n" not in request:
        chunk = conn.recv(4096)
        if not chunk:
            raise ConnectionError("closed before the handshake")
        request += chunk
    lines = request.decode("latin-1").split("\r\n")[1:]
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}
    accept = base64.b64encode(hashlib.sha1((headers["sec-websocket-key"] + GUID).encode()).digest()).decode()
    conn.sendall(
        (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept}\r\n\r\n"
        ).encode()
    )


def serve(conn: socket.socket, policy: Callable[[Any], Any]) -> None:
    with conn:
        try:
            handshake(conn)
            while True:
                opcode, payload = recv_frame(conn)
                if opcode == 0x8:  # close: answer it and end
                    send_frame(conn, 0x8, payload[:2])
                    return
                if opcode == 0x9:  # ping
                    send_frame(conn, 0xA, payload)
                elif opcode == 0x1:
                    send_frame(conn, 0x1, json.dumps(policy(json.loads(payload))).encode())
        except (ConnectionError, OSError, KeyError):
            return


def load_config(path: Path, overrides: list[str]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition(":")
        if sep and not line.startswith("#"):
            config[key.strip()] = value.strip()
    for item in overrides:
        key, _, value = item.partition("=")
        try:
            config[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            config[key] = value
    return config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config_path", required=True)
    parser.add_argument("--protocol", default="ws", choices=["ws", "legacy_tcp"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--overrides", nargs=argparse.REMAINDER, default=[])
    args = parser.parse_args()
    config_path = Path(args.config_path)
    config = load_config(config_path, args.overrides)
    spec = importlib.util.spec_from_file_location("policy_model", config_path.parent / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    policy = module.load(config)
    listener = socket.create_server((args.host, args.port))
    print(f"policy {config.get('policy_name')} serving ws://{args.host}:{args.port}", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn, policy), daemon=True).start()


if __name__ == "__main__":
    main()
