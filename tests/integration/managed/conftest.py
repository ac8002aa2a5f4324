"""Fixtures: gateways running managed backends, and nothing of theirs left behind."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.fleet.harness import Fleet
from tests.integration.managed.harness import kill_leftovers, start_managed

MakeManaged = Callable[..., Fleet]


@pytest.fixture
def make_managed(tmp_path: Path) -> Iterator[MakeManaged]:
    """make_managed(*gateway_args, **table): a gateway with managed instances (see
    `start_managed`), SIGKILLed at the end, with whatever of the test is left."""
    fleets: list[Fleet] = []

    def make(*gateway_args: str, **table: Any) -> Fleet:
        fleet = start_managed(tmp_path / f"gateway{len(fleets)}", *gateway_args, **table)
        fleets.append(fleet)
        return fleet

    try:
        yield make
    finally:
        for fleet in fleets:
            fleet.close()
        kill_leftovers(tmp_path)
