"""Child processes that never outlive the gateway.

Each runs in a process group of its own (stopped as a whole, and out of reach of a
terminal's Ctrl-C, which goes to the gateway: it stops them itself) and, on Linux,
with a parent-death signal: when the gateway dies, even by `kill -9`, the kernel
kills them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

PR_SET_PDEATHSIG = 1
#: A log past this size is copied to `<log>.1` and emptied.
LOG_CAP = 16 * 1024 * 1024


def _load_prctl() -> Any:
    """libc's prctl, looked up now: a child between fork and exec must not load it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_prctl = _load_prctl()


def _die_with(parent: int) -> Callable[[], None]:
    """Run in the child before exec: SIGKILL when the thread that forked it dies (the
    event loop's, which lives as long as the gateway)."""

    def arm() -> None:
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the gateway died before the signal was armed
            os._exit(1)

    return arm


async def spawn(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path
) -> asyncio.subprocess.Process:
    """Start `argv` in `cwd`, its output appended to `log`. Call it on the event loop's
    thread (see `_die_with`)."""
    out = await asyncio.to_thread(_open_log, log, argv)
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
            preexec_fn=_die_with(os.getpid()),
        )
    finally:
        out.close()


def _open_log(log: Path, argv: Sequence[str]) -> IO[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    cap_log(log)
    out = log.open("ab")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    out.write(f"--- {stamp} starting: {' '.join(argv)}\n".encode(errors="replace"))
    out.flush()
    return out


def cap_log(log: Path, limit: int = LOG_CAP) -> None:
    """Keep a log under `limit`: past it, its content moves to `<log>.1` (replacing the
    one before) and it starts over. The process keeps writing: it appends."""
    try:
        if log.stat().st_size <= limit:
            return
        shutil.copyfile(log, log.with_name(log.name + ".1"))
        os.truncate(log, 0)
    except OSError:
        pass  # no log yet, or a full disk: the next look tries again


async def terminate(proc: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM to its group, SIGKILL after `grace` seconds; then SIGKILL to whatever of
    its group is left."""
    if proc.returncode is None:
        _signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), grace)
    _signal_group(proc.pid, signal.SIGKILL)
    await proc.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def exit_reason(returncode: int | None, lived: float) -> str:
    """`exited with code 3 after 0.4 s`, `killed by SIGKILL after 12 s`."""
    if returncode is not None and returncode < 0:
        try:
            how = f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"killed by signal {-returncode}"
    else:
        how = f"exited with code {returncode}"
    return f"{how} after {lived:.1f} s"


def rss_bytes(pid: int) -> int | None:
    """The process's resident memory (VmRSS), None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
