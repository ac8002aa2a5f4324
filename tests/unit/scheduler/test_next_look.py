"""When a gateway looks again for what gone gateways left: at its renewal beat, or just
after another gateway's lease runs out if that comes first (a gateway killed right
after its heartbeat is taken over at its lease's end, not a beat later)."""

from __future__ import annotations

from comfyfleet.domain.gateways import LOOK_AFTER_EXPIRY, MIN_LOOK, GatewayRecord, next_look

NOW = 1000.0


def gateway(gateway_id: str, lease_until: float) -> GatewayRecord:
    return GatewayRecord(gateway_id, "i", "host", 1, "http://x", 0.0, NOW, lease_until)


def test_alone_a_gateway_looks_at_its_beat() -> None:
    assert next_look("me", [gateway("me", NOW + 10)], 9.0, NOW) == 3.0


def test_another_lease_ending_before_the_beat_is_looked_at_just_after_it_ends() -> None:
    live = [gateway("me", NOW + 10), gateway("other", NOW + 1.0)]
    assert next_look("me", live, 9.0, NOW) == 1.0 + LOOK_AFTER_EXPIRY


def test_a_lease_ending_after_the_beat_waits_for_the_beat() -> None:
    live = [gateway("me", NOW + 10), gateway("other", NOW + 8.0)]
    assert next_look("me", live, 9.0, NOW) == 3.0


def test_a_lease_already_over_does_not_make_a_busy_loop() -> None:
    live = [gateway("other", NOW - 5.0)]
    assert next_look("me", live, 9.0, NOW) == MIN_LOOK
