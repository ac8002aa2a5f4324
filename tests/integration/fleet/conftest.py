"""Fixtures: backend processes (`serve --local-slots 1 --testing-nodes`) and a gateway
(`serve --local-slots 0`) feeding them, cleaned up whatever the test did to them.

Four backends are shared by the whole session (each test's gateway has its own data
dir, and whatever a test leaves queued or running there is cleared afterwards); a test
that kills, stops or specially configures a backend gets dedicated ones.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.integration.fleet.harness import (
    Fleet,
    backend_process,
    gateway_config,
    reset_backend,
    start_all,
)
from tests.servers import ServerProcess

POOL_SIZE = 4

MakeFleet = Callable[..., Fleet]


def _kill(server: ServerProcess) -> None:
    """SIGCONT first (a stopped process must not outlive the test), then SIGKILL."""
    if server.proc is not None and server.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.proc.pid, signal.SIGCONT)
    server.kill()


@pytest.fixture(scope="session")
def backend_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    root = tmp_path_factory.mktemp("pool")
    pool = [backend_process(root / f"s{i}") for i in range(POOL_SIZE)]
    try:
        start_all(pool)
        yield pool
    finally:
        for backend in pool:
            _kill(backend)


@pytest.fixture
def make_fleet(tmp_path: Path, backend_pool: list[ServerProcess]) -> Iterator[MakeFleet]:
    """make_fleet(shared=N, dedicated=[extra args, ...], gateway_args=(), flags=False,
    backend_fields=None).

    Shared backends are named s0.., dedicated ones d0..; with `flags` the gateway gets
    `--backend URL` options (names then derive from the url), else a config file with
    `[[backends]]` tables (each with `backend_fields`, e.g. `{"prefetch": 1}`). Returns
    once the admin API shows every backend up.
    """
    fleets: list[Fleet] = []
    dedicated_procs: list[ServerProcess] = []
    used_pool: list[ServerProcess] = []

    def make(
        shared: int = 0,
        dedicated: Sequence[Sequence[str]] = (),
        gateway_args: Sequence[str] = (),
        flags: bool = False,
        backend_fields: dict[str, Any] | None = None,
    ) -> Fleet:
        index = len(fleets)
        named: list[tuple[str, ServerProcess]] = [
            (f"s{i}", backend) for i, backend in enumerate(backend_pool[:shared])
        ]
        used_pool.extend(backend_pool[:shared])
        own = [
            backend_process(tmp_path / f"fleet{index}-d{i}", *extra)
            for i, extra in enumerate(dedicated)
        ]
        dedicated_procs.extend(own)
        named += [(f"d{i}", backend) for i, backend in enumerate(own)]
        gateway_dir = tmp_path / f"fleet{index}-gateway"
        if flags:
            args = [arg for _, b in named for arg in ("--backend", b.url)]
            named = [(f"127.0.0.1-{b.port}", b) for _, b in named]
        else:
            config = gateway_config(gateway_dir / "fleet.toml", named, backend_fields)
            args = ["--config", str(config)]
        gateway = ServerProcess(gateway_dir, "--local-slots", "0", *args, *gateway_args)
        fleet = Fleet(gateway, dict(named))
        fleets.append(fleet)
        # The gateway starts while the dedicated backends do; it reconnects until they answer.
        start_all([*own, gateway])
        fleet.wait_all_up()
        return fleet

    try:
        yield make
    finally:
        for fleet in fleets:
            fleet.close()
            for backend in fleet.backends.values():
                if backend not in backend_pool:
                    _kill(backend)
        for backend in dedicated_procs:
            _kill(backend)
        for backend in dict.fromkeys(used_pool):
            reset_backend(backend)
