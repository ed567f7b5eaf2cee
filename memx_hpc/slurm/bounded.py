"""Running a Slurm client with a bound on what it may print and how long it may take.

A Slurm client's answer is read before it is parsed; an answer that never ends (a broken
client, a node list of a million names) must not run the login node out of memory, and a
controller that is down must not hang the caller.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time

from ..errors import SystemFailure

__all__ = ["bounded_run"]


def bounded_run(argv: list[str], timeout_s: float, cap_bytes: int) -> tuple[int, bytes, bytes]:
    """Run ``argv``; its exit status, stdout and stderr, each read up to ``cap_bytes``.
    SystemFailure (the process killed) when it prints more or outlives ``timeout_s``."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    name = " ".join(os.path.basename(argv[0]).split() + argv[1:])
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    deadline = time.monotonic() + timeout_s
    try:
        with selectors.DefaultSelector() as sel:
            for f in bufs:
                sel.register(f, selectors.EVENT_READ)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SystemFailure(f"{name} did not answer within {timeout_s:g} s (is slurmctld running?)")
                for key, _ in sel.select(timeout=left):
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    buf = bufs[key.fileobj]
                    buf += chunk
                    if len(buf) > cap_bytes:
                        raise SystemFailure(f"{name} printed more than {cap_bytes / 2**20:g} MiB; stopped reading "
                                            "it (a Slurm client answers far less)")
        left = max(0.1, deadline - time.monotonic())
        try:
            rc = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            raise SystemFailure(f"{name} did not exit within {timeout_s:g} s") from None
        return rc, bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in bufs:
            f.close()
