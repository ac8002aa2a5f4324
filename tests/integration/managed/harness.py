"""A gateway process with managed backends: `comfyfleet serve --local-slots 1` processes
it starts itself (through a `[[comfyui]]` command template), real processes speaking the
real protocol.

Each managed instance is reached directly as a `ServerProcess` that is never started
(its url is all the fleet harness needs), so `Fleet` works unchanged: submit, follow,
the admin API, the backends' own queues.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
from pathlib import Path
from typing import Any

from comfyfleet.managed.spec import COMFYFLEET_COMMAND
from tests.integration.fleet.harness import Fleet, poll
from tests.servers import ServerProcess

#: The managed process: a one-at-a-time ComfyUI stand-in on the port it is given.
INSTANCE = list(COMFYFLEET_COMMAND)


def port_block(size: int = 40) -> list[int]:
    """A range of ports below the ephemeral ones (busy ports in it are skipped)."""
    first = random.randrange(20_000, 32_000 - size)
    return [first, first + size - 1]


def managed_config(path: Path, **table: Any) -> Path:
    """A config file with one `[[comfyui]]` table: `name = "m"`, on the CPU, running
    `INSTANCE`, with `table`'s keys on top."""
    fields = {"name": "m", "gpus": "cpu", "command": INSTANCE, "port_range": port_block()}
    fields.update(table)
    lines = ["[[comfyui]]", *(f"{key} = {json.dumps(value)}" for key, value in fields.items())]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def start_managed(data_dir: Path, *gateway_args: str, **table: Any) -> Fleet:
    """A gateway (`--local-slots 0`) running `per_gpu` managed instances, once every one
    of them takes work."""
    config = managed_config(data_dir.parent / f"{data_dir.name}.toml", **table)
    gateway = ServerProcess(data_dir, "--local-slots", "0", "--config", str(config), *gateway_args)
    gateway.start(60.0)
    fleet = Fleet(gateway, {})
    expected = table.get("per_gpu", 1)
    poll(lambda: len(fleet.backend_states()) == expected, what="the managed backends listed")
    for name, state in fleet.backend_states().items():
        fleet.backends[name] = ServerProcess(data_dir, port=state["managed"]["port"])
    fleet.wait_all_up(timeout=60)
    return fleet


def managed(fleet: Fleet, name: str) -> dict[str, Any]:
    """The admin API's `managed` object of an instance."""
    found: dict[str, Any] = fleet.backend_states()[name]["managed"]
    return found


def pids(fleet: Fleet) -> dict[str, int]:
    return {name: state["managed"]["pid"] for name, state in fleet.backend_states().items()}


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_leftovers(root: Path) -> list[int]:
    """SIGKILL every process whose command line names a path under `root` (this test's
    own folder): nothing a test started outlives it, whatever the code under test did."""
    killed = []
    marker = str(root).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed
