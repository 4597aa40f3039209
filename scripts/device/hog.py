#!/usr/bin/env python3
"""A model service stand-in for the device check: it holds a fixed amount of memory on its
GPU (through the CUDA driver, ``libcuda.so.1``, with ctypes: no torch, no wheel, so it runs
on an offline GPU machine from an environment of the standard library alone), then answers
``GET /health`` with what it holds. With ``--host`` it holds host memory instead (the same
flow on a machine without a GPU). Standard library only.

    hog.py --port PORT --gb 2 [--host] [--name NAME]

A CUDA failure exits 3 with one line naming the call and the driver's error code.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_GIB = 1024**3


def hold_gpu(nbytes: int) -> object:
    """Allocate and write ``nbytes`` on CUDA device 0 (the first this process sees)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        sys.exit(f"hog: no CUDA driver here ({exc}); use --host on a machine without a GPU")

    def check(result: int, call: str) -> None:
        if result != 0:
            print(f"hog: {call} failed: CUDA error {result}", flush=True)
            sys.exit(3)

    check(cuda.cuInit(0), "cuInit")
    device = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    context = ctypes.c_void_p()
    check(cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device), "cuCtxCreate")
    pointer = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(nbytes)), f"cuMemAlloc({nbytes})")
    check(cuda.cuMemsetD8_v2(pointer, ctypes.c_ubyte(1), ctypes.c_size_t(nbytes)), "cuMemsetD8")
    check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    return (context, pointer)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--gb", type=float, required=True)
    parser.add_argument("--host", action="store_true", help="hold host memory (no GPU)")
    parser.add_argument("--name", default="hog")
    args = parser.parse_args()
    nbytes = int(args.gb * _GIB)
    held = b"\1" * nbytes if args.host else hold_gpu(nbytes)
    answer = json.dumps(
        {
            "status": "ok",
            "name": args.name,
            "pid": os.getpid(),
            "device": "host" if args.host else "cuda",
            "bytes": nbytes,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
    ).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = 200 if self.path == "/health" else 404
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"hog {args.name}: holding {nbytes} bytes on {'the host' if args.host else 'CUDA device 0'}", flush=True)
    try:
        server.serve_forever()
    finally:
        del held


if __name__ == "__main__":
    main()
