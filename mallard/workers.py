"""`mallard serve --workers N`: N server processes on one port, the kernel as their load balancer.

One Python process tops out at what one core does (the collector's decode, validation and group
commit run on its event loop). Each worker is a whole `mallard serve`, what DESIGN calls a
collector with its API replica: its own collector id (so its own write-ahead log and landing
files, `<id>-w<i>` for worker i > 0, worker 0 keeps the configured id so a data dir served by one
process before keeps its log), its own read index, rate-limit buckets and pages process. Each
binds the port with SO_REUSEPORT, and the kernel spreads new connections over the workers that
listen; a worker joins once its start-up is done (uvicorn listens after the lifespan).

The supervising process binds nothing: it starts the workers, passes SIGTERM and SIGINT on to
them, and when one worker exits it stops the others and exits with that worker's code, so a
service manager restarts the whole. A worker dies with its supervisor (PR_SET_PDEATHSIG), so a
killed supervisor leaves no worker holding the port.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from types import FrameType

# prctl(2): the signal a process gets when its parent exits.
_PR_SET_PDEATHSIG = 1


def collector_id(base: str, index: int) -> str:
    """The collector id of worker `index`: the configured one for worker 0."""
    return base if index == 0 else f"{base}-w{index}"


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port that other workers' sockets may bind too; not listening
    yet (the server listens on it once its start-up is done)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def die_with_parent() -> None:
    """In a child before exec: SIGTERM when its parent exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def supervise_servers(serve_args: Sequence[str], workers: int, base_collector_id: str) -> int:
    """`mallard serve <serve_args> --worker i` for i in range(workers), each with its collector
    id, under `supervise`."""
    serve = [sys.executable, "-m", "mallard.cli", "serve", *serve_args, "--worker"]
    return supervise(
        [[*serve, str(i)] for i in range(workers)],
        [{"MALLARD_COLLECTOR_ID": collector_id(base_collector_id, i)} for i in range(workers)],
    )


def supervise(
    commands: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]] | None = None
) -> int:
    """Run each command (with this process's environment and its entry of `envs`) until one
    exits or a signal stops them; the exit code of the first to exit (0 when stopped by a
    signal)."""
    procs: list[subprocess.Popen[bytes]] = []
    stopping = False

    def stop(sig: int, frame: FrameType | None = None) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for i, command in enumerate(commands):
            procs.append(
                subprocess.Popen(
                    command,
                    env={**os.environ, **(envs[i] if envs else {})},
                    preexec_fn=die_with_parent,
                )
            )
        while (first := next((p for p in procs if p.poll() is not None), None)) is None:
            time.sleep(0.2)
        code, signalled = first.returncode, stopping
        stop(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return 0 if signalled else code
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
