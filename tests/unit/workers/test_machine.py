"""A worker's machine as the gateway keeps it: only the devices, memory and version of
its backend's `/system_stats`, checked and capped; its command line never."""

from __future__ import annotations

from comfyfleet.server.workers.machine import MAX_DEVICES, MAX_TEXT, machine_of


def test_only_the_fields_shown_are_kept() -> None:
    stats = {
        "system": {
            "os": "posix",
            "ram_total": 64_000_000_000,
            "ram_free": 1_000,
            "comfyui_version": "0.3.64",
            "argv": ["main.py", "--api-key", "sk-secret"],
        },
        "devices": [
            {"name": "NVIDIA L4", "type": "cuda", "index": 0, "vram_total": 23_000, "vram_free": 5}
        ],
    }
    assert machine_of(stats) == {
        "devices": [{"name": "NVIDIA L4", "type": "cuda", "vram_total": 23_000, "vram_free": 5}],
        "ram_total": 64_000_000_000,
        "ram_free": 1_000,
        "comfyui_version": "0.3.64",
    }
    assert "sk-secret" not in repr(machine_of(stats))


def test_what_is_not_of_its_kind_is_left_out() -> None:
    hostile = {
        "system": {"ram_total": -1, "ram_free": True, "comfyui_version": "x" * 10_000},
        "devices": [{"name": 7, "vram_total": 2**80}, "not a device"] + [{}] * 100,
    }
    machine = machine_of(hostile)
    assert machine["ram_total"] is None and machine["ram_free"] is None
    assert machine["comfyui_version"] == "x" * MAX_TEXT
    assert len(machine["devices"]) == MAX_DEVICES - 1  # the string skipped, the rest capped
    assert machine["devices"][0] == {
        "name": None,
        "type": None,
        "vram_total": None,
        "vram_free": None,
    }
    nonsenses: list[object] = [None, [], "x", {"system": [], "devices": {}}]
    for nonsense in nonsenses:
        assert machine_of(nonsense) == {
            "devices": [],
            "ram_total": None,
            "ram_free": None,
            "comfyui_version": None,
        }
