"""Free loopback ports for services the tests start.

Fixed ports collided whenever two suites ran on one machine (two engineers, or CI beside a
developer): a service found its port held and the run failed for a reason no test meant.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's choice). Another
    process could take it before the caller binds it; the ephemeral range makes that rare."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
