"""Which lane should take a pending job: capabilities, the lanes a re-queued job avoids,
and affinity (a warmer lane, or one that starts the job at once, goes first).

Pure functions of the scheduler's state, asked on the event loop for each candidate."""

from __future__ import annotations

import enum

from comfyfleet.domain.jobs import Job
from comfyfleet.scheduler.slots import LaneSlots
from comfyfleet.scheduler.state import SchedulerState


class Verdict(enum.Enum):
    """What a lane makes of a candidate."""

    TAKE = "take"
    PASS = "pass"  # not for this lane
    LEAVE = "leave"  # for another lane, free now, that starts it sooner or is warmer


def may_take(state: SchedulerState, entry: LaneSlots, job: Job) -> bool:
    if not state.holds.allows(job.prompt_id, job.extra_data):
        return False  # its gateway has not said it still wants it
    if not state.shares.policy.of(job.tenant).allows_lane(entry.lane.name):
        return False  # its tenant may not use this lane
    return not entry.retiring and entry.lane.can_run(job) and not avoided(state, entry, job)


def avoided(state: SchedulerState, entry: LaneSlots, job: Job) -> bool:
    """A re-queued job leaves the lanes it failed on to any other lane that can run it."""
    avoid = state.avoid.get(job.prompt_id)
    if not avoid or entry.lane.name not in avoid:
        return False
    others = [o for o in state.lanes.values() if o.lane.name not in avoid]
    return any(not o.retiring and o.lane.can_run(job) for o in others)


def eligible(state: SchedulerState, entry: LaneSlots, job: Job) -> Verdict:
    """Whether this lane should take the job now.

    Affinity: the job is left to another lane that is free right now and warmer, but
    not to one the job avoids (it would leave the job too, and no lane would take it).
    The free lanes are looked at lazily, and not at all when none can beat this one:
    a fleet of a thousand idle backends asks this of every job it claims."""
    if not may_take(state, entry, job):
        return Verdict.PASS
    avoid = state.avoid.get(job.prompt_id)

    def rival(other: LaneSlots) -> bool:
        return (
            other is not entry
            and state.free.get(other.lane.name) is other
            and not (avoid and other.lane.name in avoid)
            and other.free_for(job)
            and (entry.would_queue or not other.would_queue)  # at once: only such compete
        )

    if entry.would_queue and any(
        not other.would_queue and rival(other) for other in state.free.values()
    ):
        return Verdict.LEAVE  # a lane that starts it at once takes it
    if not state.free or (len(state.free) == 1 and entry.lane.name in state.free):
        return Verdict.TAKE  # the common case (one lane, or the others busy): no scoring
    wanted = state.warmth_of(job)
    mine = entry.warmth.score(wanted)
    if mine == wanted.best():
        return Verdict.TAKE  # as warm as a lane can be for it
    # Only a lane that shares something with the job can score above this one.
    if any(o.warmth.score(wanted) > mine and rival(o) for o in state.warm_for(wanted)):
        return Verdict.LEAVE  # the others are woken once this claim returns
    return Verdict.TAKE


def reservable(state: SchedulerState, entry: LaneSlots, job: Job) -> Verdict:
    """Whether a busy lane sets the job aside: one a free lane could take now is left
    to it, and one of a tenant with a cap on running jobs is only ever claimed (its
    claim counts them)."""
    if not may_take(state, entry, job):
        return Verdict.PASS
    if state.shares.policy.of(job.tenant).max_running is not None:
        return Verdict.PASS
    if any(o is not entry and o.free_for(job) for o in state.free.values()):
        return Verdict.PASS  # its slot takes it without a wake-up
    return Verdict.TAKE
