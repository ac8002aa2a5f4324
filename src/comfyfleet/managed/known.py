"""What a managed instance offered when it last ran (its node classes and model files),
kept in its folder: until it answers again, the gateway validates and queues prompts
for it from that, instead of refusing every class only ComfyUI has."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from comfyfleet.folders import UnsafePath, resolve_inside
from comfyfleet.lanes.capabilities import Capabilities

log = logging.getLogger(__name__)

NAME = "capabilities.json"
MAX_BYTES = 64 * 1024 * 1024  # a real ComfyUI's object_info is a few megabytes


def load_known(folder: Path) -> Capabilities | None:
    """The capabilities saved in `folder`; None when there are none that can be used
    (the file is read like a backend's answer: anything may be in it)."""
    try:
        with resolve_inside(folder, NAME).open("rb") as file:
            raw = file.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            return None
        data = json.loads(raw)
        object_info, models = data["object_info"], data["models"]
        if not isinstance(object_info, dict) or not isinstance(models, dict):
            return None
        if not all(
            isinstance(v, list) and all(isinstance(f, str) for f in v) for v in models.values()
        ):
            return None
        return Capabilities.from_object_info(object_info, models)
    except FileNotFoundError:
        return None
    except (OSError, UnsafePath, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("%s/%s left aside: %s", folder, NAME, exc)
        return None


def save_known(folder: Path, capabilities: Capabilities) -> None:
    """Replace the saved capabilities (written aside, then renamed into place)."""
    data = {"object_info": capabilities.object_info, "models": capabilities.models}
    try:
        path = resolve_inside(folder, NAME, follow_last=False)
        aside = resolve_inside(folder, NAME + ".new", follow_last=False)
        aside.unlink(missing_ok=True)  # written anew, never through a link
        aside.write_text(json.dumps(data), encoding="utf-8")
        os.replace(aside, path)
    except (OSError, UnsafePath) as exc:
        log.warning("could not save %s/%s: %s", folder, NAME, exc)
