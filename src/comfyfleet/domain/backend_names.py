"""What names a backend, and the error of a backend definition: read by the fleet and by
what starts backends (managed ones, a worker's), which need not load the fleet."""

from __future__ import annotations

import re

from comfyfleet.errors import ComfyfleetError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class FleetError(ComfyfleetError, ValueError):
    """A backend definition or change that cannot be applied; the message says why."""
