"""One real server per fuzz module, shared by every example (it must keep serving)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fuzz.harness import LiveServer


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path_factory.mktemp("fuzz"), local_slots=2, shutdown_grace=0.2)
    try:
        yield server
        server.quiesce()
        server.assert_serving()
    finally:
        server.close()
