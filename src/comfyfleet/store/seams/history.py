"""History: finished jobs' entries, deleted on request or pruned by retention."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from comfyfleet.domain.jobs import HistoryEntry, OutputFile


class JobHistory(Protocol):
    """Entries in completion order, paged as ComfyUI pages them."""

    async def history(
        self, max_items: int | None = None, offset: int | None = None, *, tenant: str | None = None
    ) -> list[HistoryEntry]:
        """Entries in completion order, paged as ComfyUI does: without offset (or
        with a negative one), the newest `max_items`, oldest first; with offset,
        skip `offset` from the oldest, then at most `max_items`. None: no limit.
        `max_items` <= 0 gives nothing. With `tenant`, only that tenant's entries
        (paged among themselves)."""

    async def history_entry(self, prompt_id: str) -> HistoryEntry | None: ...

    async def delete_history(self, prompt_ids: Sequence[str]) -> None:
        """Remove these history entries (unknown ids are ignored). The jobs stay, with
        their output records, until pruned."""

    async def clear_history(self, *, tenant: str | None = None) -> None:
        """Remove every history entry (only `tenant`'s when one is named); the jobs stay,
        as with `delete_history`."""

    async def prune_history(
        self, *, max_entries: int | None, max_age_seconds: float | None
    ) -> list[OutputFile]:
        """Delete the oldest history entries beyond `max_entries` and those older than
        `max_age_seconds`, with their jobs, events and output records. Finished jobs
        without an entry (cancelled, or entry deleted) go too once they finished
        before the cutoff or before the newest entry dropped. Returns the output
        files of everything deleted, oldest first (the caller deletes them from
        disk), each with its job's tenant. Pending and running jobs are never pruned."""

    async def listed_outputs(self, files: Sequence[OutputFile]) -> set[OutputFile]:
        """Those of `files` that a job in the store still lists among its output files
        (same tenant, type, subfolder and name): the others' history entries are gone."""
