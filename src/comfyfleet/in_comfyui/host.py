"""The fan-out loop: one event loop thread per ComfyUI process, owning the pools and journal.

ComfyUI runs every prompt in a fresh event loop (`asyncio.run` per prompt), so
nothing that outlives a prompt can live there: the pools, the jobs they run, the
provider sessions and the journal live on this loop instead, for the whole
process. Node calls are started here from the prompt's loop and awaited there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from comfyfleet.domain.budgets import Usage
from comfyfleet.fanout import FanoutService, FanoutSettings, SecretVault
from comfyfleet.folders import resolve_inside
from comfyfleet.in_comfyui.allowances import PromptAllowances
from comfyfleet.nodes.providers import DRIVERS
from comfyfleet.shares.policy import SharePolicy
from comfyfleet.spend.guard import BudgetGuard
from comfyfleet.spend.prices import PriceTable
from comfyfleet.store.sqlite import SQLiteStore

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The journal's file, under ComfyUI's user directory.
JOURNAL_FOLDER, JOURNAL_NAME = "comfyfleet", "fanout-journal.db"
SECRETS_FILE_VARIABLE = "COMFYFLEET_SECRETS_FILE"


def journal_path(user_dir: Path) -> Path:
    """The journal file; a link in the way may not lead out of the user directory."""
    return resolve_inside(user_dir, f"{JOURNAL_FOLDER}/{JOURNAL_NAME}")


class Call:
    """A coroutine running on the fan-out loop: its outcome, and a way to cancel it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, Any]) -> None:
        self.outcome: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._loop = loop
        self._task: asyncio.Task[Any] | None = None
        loop.call_soon_threadsafe(self._begin, work)

    def _begin(self, work: Coroutine[Any, Any, Any]) -> None:
        self._task = self._loop.create_task(work)
        self._task.add_done_callback(self._settle)

    def _settle(self, task: asyncio.Task[Any]) -> None:
        # The outcome resolves only once the work has really ended (its clean-up too).
        if task.cancelled():
            self.outcome.cancel()
        elif (error := task.exception()) is not None:
            self.outcome.set_exception(error)
        else:
            self.outcome.set_result(task.result())

    def cancel(self) -> None:
        """Ask the work to stop; `outcome` resolves when it has."""
        self._loop.call_soon_threadsafe(self._cancel_task)

    def _cancel_task(self) -> None:
        if self._task is not None:
            self._task.cancel()


class FanoutHost:
    """The process's fan-out service, on its own loop thread (a daemon: ComfyUI's exit
    leaves remote jobs running in the journal, and the next start re-attaches them)."""

    def __init__(
        self,
        user_dir: Path,
        env: Mapping[str, str] = os.environ,
        allowances: PromptAllowances | None = None,
    ) -> None:
        self.journal_file = journal_path(user_dir)
        self._env = env
        # The allowances of the gateways that send prompts here (see spend/allowance.py).
        self.allowances = allowances or PromptAllowances()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="comfyfleet-fanout", daemon=True
        )
        self.store: SQLiteStore | None = None
        self.service: FanoutService | None = None

    def start(self, timeout: float = 60.0) -> FanoutService:
        """Start the loop, open the journal and re-attach jobs left running; blocks."""
        self._thread.start()
        service: FanoutService = self.run(self._open(), timeout)
        return service

    async def _open(self) -> FanoutService:
        self.journal_file.parent.mkdir(parents=True, exist_ok=True)
        store = SQLiteStore(self.journal_file)
        await store.open()
        secrets_file = self._env.get(SECRETS_FILE_VARIABLE) or None
        vault = SecretVault(Path(secrets_file) if secrets_file else None, env=self._env)
        settings = FanoutSettings.from_env(self._env)
        budgets = BudgetGuard(SharePolicy(), PriceTable(), self.allowances)
        service = FanoutService(store, vault, settings, DRIVERS, budgets=budgets)
        self.store, self.service = store, service
        await service.resume()
        log.info("comfyfleet fan-out: journal %s", self.journal_file)
        return service

    async def paid_by(self, prompt_id: str) -> Usage:
        """What the prompt's paid jobs here may have cost (the journal's count)."""
        assert self.store is not None, "started"
        return await self.store.prompt_paid_usage(prompt_id)

    def start_call(self, work: Coroutine[Any, Any, T]) -> Call:
        return Call(self.loop, work)

    def run(self, work: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `work` on the loop and wait for it from another thread."""
        result: T = asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)
        return result

    def stop(self, timeout: float = 30.0) -> None:
        """Leave remote jobs running (journaled), close the journal, end the thread."""
        if not self._thread.is_alive():
            return
        try:
            self.run(self._close(), timeout)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self.loop.close()

    async def _close(self) -> None:
        if self.service is not None:
            await self.service.detach()
        if self.store is not None:
            await self.store.close()
