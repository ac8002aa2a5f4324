"""What a worker's machine is, as its backend reports it (`GET /system_stats`): its
devices and their memory, the machine's memory, the ComfyUI version. Only these fields,
each checked and capped: the answer comes from outside, and the rest of it (the
process's command line, say) may hold what no one else should see."""

from __future__ import annotations

from typing import Any

MAX_DEVICES = 16
MAX_TEXT = 200


def machine_of(stats: Any) -> dict[str, Any]:
    system = stats.get("system") if isinstance(stats, dict) else None
    system = system if isinstance(system, dict) else {}
    devices = stats.get("devices") if isinstance(stats, dict) else None
    devices = devices if isinstance(devices, list) else []
    return {
        "devices": [
            {
                "name": _text(device.get("name")),
                "type": _text(device.get("type")),
                "vram_total": _bytes(device.get("vram_total")),
                "vram_free": _bytes(device.get("vram_free")),
            }
            for device in devices[:MAX_DEVICES]
            if isinstance(device, dict)
        ],
        "ram_total": _bytes(system.get("ram_total")),
        "ram_free": _bytes(system.get("ram_free")),
        "comfyui_version": _text(system.get("comfyui_version")),
    }


def _text(value: Any) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


def _bytes(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
    return value if ok else None
