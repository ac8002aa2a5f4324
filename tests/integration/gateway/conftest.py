"""Fixtures for the gateway's end-to-end tests: real servers, in this process or as a child."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import ServerProcess


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[ServerProcess]:
    """`comfyfleet serve --testing-nodes` on a free port, killed at the end."""
    with ServerProcess(tmp_path / "data") as server:
        yield server
