"""How a ComfyUI lane treats its backend: timeouts, probes, backoff and holds."""

from __future__ import annotations

from dataclasses import dataclass

#: Seconds without a frame from a running prompt before the backend's history is asked
#: whether it ended (and again as often while it stays quiet).
QUIET_ASK = 5.0
#: Beyond a comfyfleet backend's hold, before its prompt is taken for lost (s): the two
#: clocks need not tick alike.
HOLD_MARGIN = 1.0


@dataclass(frozen=True)
class LaneSettings:
    hang_timeout: float = 300.0  # seconds without a frame while a prompt runs there
    copy_outputs: bool = True
    probe_interval: float = 5.0  # health check of a connected backend
    suspect_for: float = 60.0  # after a hang, no new work for this long
    refresh_interval: float = 60.0  # re-read object_info (new nodes, new model files)
    max_backoff: float = 30.0  # longest wait between reconnect attempts
    # A comfyfleet backend runs this gateway's prompts only while told, this long each
    # time (renewed every probe): a backend lost longer than this has dropped them.
    hold: float = 30.0
