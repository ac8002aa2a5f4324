"""The jobs set aside for busy lanes, kept in queue order and by lane.

A fleet of a thousand backends holds about a thousand of them; each free slot asks for
its lane's earliest and for the earliest it could take of the others, and each new job
for those behind it in the queue. Kept sorted and indexed, each of those costs what it
finds, not a pass over all of them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeAlias

from sortedcontainers import SortedKeyList

from comfyfleet.domain.jobs import DispatchKey
from comfyfleet.scheduler.slots import LaneSlots, Reservation

_Order: TypeAlias = tuple[DispatchKey, str]


def _order(reservation: Reservation) -> _Order:
    return reservation.job.dispatch_key(), reservation.job.prompt_id


class ReservedJobs:
    """Reservations by prompt id, in queue order, and per owning lane."""

    def __init__(self) -> None:
        self._by_id: dict[str, Reservation] = {}
        self._in_order: SortedKeyList[Reservation, _Order] = SortedKeyList(key=_order)
        self._by_lane: dict[str, SortedKeyList[Reservation, _Order]] = {}
        self._held: dict[LaneSlots, int] = {}  # how many each lane holds: asked per job

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, prompt_id: object) -> bool:
        return prompt_id in self._by_id

    def add(self, reservation: Reservation) -> None:
        self.pop(reservation.job.prompt_id)
        self._by_id[reservation.job.prompt_id] = reservation
        self._in_order.add(reservation)
        lane = reservation.owner.lane.name
        self._by_lane.setdefault(lane, SortedKeyList(key=_order)).add(reservation)
        self._held[reservation.owner] = self._held.get(reservation.owner, 0) + 1

    def pop(self, prompt_id: str) -> Reservation | None:
        reservation = self._by_id.pop(prompt_id, None)
        if reservation is not None:
            self._in_order.remove(reservation)
            lane = reservation.owner.lane.name
            mine = self._by_lane[lane]
            mine.remove(reservation)
            if not mine:
                del self._by_lane[lane]
            left = self._held.pop(reservation.owner) - 1
            if left:
                self._held[reservation.owner] = left
        return reservation

    def clear(self) -> None:
        self._by_id.clear()
        self._in_order.clear()
        self._by_lane.clear()
        self._held.clear()

    def in_order(self) -> Iterator[Reservation]:
        """Every reservation, earliest in the queue first."""
        return iter(self._in_order)

    def of_lane(self, entry: LaneSlots) -> list[Reservation]:
        """The lane's reservations, earliest first."""
        mine = self._by_lane.get(entry.lane.name)
        return [] if mine is None else [r for r in mine if r.owner is entry]

    def held_by(self, entry: LaneSlots) -> int:
        return self._held.get(entry, 0)

    def behind(self, key: DispatchKey) -> list[Reservation]:
        """The reservations after `key` in queue order."""
        after = self._in_order.bisect_key_right((key, "\U0010ffff"))
        return list(self._in_order.islice(after))
