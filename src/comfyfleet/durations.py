"""Durations as the config file writes them: `90`, `90s`, `15m`, `12h`, `30d`, `2w`."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """Seconds; ValueError when `text` is not a duration."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 15m, 12h, 30d)")
    return float(match.group(1)) * _UNITS[match.group(2)]
