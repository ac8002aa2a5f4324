"""The companion pack leaves ComfyUI's start-up objects out of garbage collection, so
the collection ComfyUI runs after a prompt does not walk them (unless told not to)."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import gc, os
from comfyfleet.in_comfyui import freeze_startup_objects
junk = [[[] for _ in range(200)] for _ in range(2_000)]  # start-up objects (tracked)
walked = len(gc.get_objects())  # what a full collection walks
frozen = freeze_startup_objects(os.environ)
later = [[] for _ in range(1_000)]  # a prompt's objects: still collected
print(frozen, walked, len(gc.get_objects()))
"""


def probe(**env: str) -> tuple[int, int, int]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    frozen, walked, after = done.stdout.split()
    return int(frozen), int(walked), int(after)


def test_start_up_objects_are_frozen_and_a_collection_no_longer_walks_them() -> None:
    frozen, walked, after = probe()
    assert frozen > 400_000 and walked > 400_000  # the 400,000 lists made, and the rest
    assert 1_000 <= after < 5_000  # what came after the freeze, and little else


def test_zero_leaves_the_collector_as_it_is() -> None:
    frozen, walked, after = probe(COMFYFLEET_PACK_GC_FREEZE="0")
    assert frozen == 0 and after >= walked
