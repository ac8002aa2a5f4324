"""Allowances of the prompts queued in this ComfyUI (see comfyfleet.spend.allowance).

ComfyUI's nodes never see a prompt's `extra_data`, so an on-prompt handler notes each
prompt's allowance by its id as ComfyUI receives it, and the fan-out's budget check
looks it up there. ComfyUI's queue lives in its process, and so do these.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from typing import Any

from comfyfleet.domain.budgets import ALLOWANCE_KEY, Budget
from comfyfleet.spend.allowance import Allowance, allowance_of
from comfyfleet.spend.budget import BadBudget
from comfyfleet.spend.guard import PromptTerms

#: Prompts whose allowances are kept (far more than a ComfyUI queue holds at once).
KEPT = 10_000
#: What a prompt with an allowance that cannot be read may spend: nothing.
NOTHING = Allowance(Budget(0, 0.0))


class PromptAllowances:
    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._by_prompt: OrderedDict[str, Allowance] = OrderedDict()
        self._lock = threading.Lock()  # noted on ComfyUI's loop, read on the fan-out's

    def note(self, body: dict[str, Any]) -> dict[str, Any]:
        """An on-prompt handler: remember the prompt's allowance (giving the prompt the
        id ComfyUI would otherwise make up, so the allowance can be found by it)."""
        extra = body.get("extra_data")
        if not isinstance(extra, dict) or extra.get(ALLOWANCE_KEY) is None:
            return body
        try:
            found = allowance_of(extra) or NOTHING
        except BadBudget:  # no gateway sends one: whoever did gets no paid job
            found = NOTHING
        prompt_id = body.get("prompt_id")
        if prompt_id is None:
            prompt_id = str(uuid.uuid4())
            body = {**body, "prompt_id": prompt_id}
        with self._lock:
            self._by_prompt[str(prompt_id)] = found
            self._by_prompt.move_to_end(str(prompt_id))
            while len(self._by_prompt) > self._kept:
                self._by_prompt.popitem(last=False)
        return body

    async def terms_of(self, prompt_id: str) -> PromptTerms | None:
        with self._lock:
            found = self._by_prompt.get(prompt_id)
        return None if found is None else PromptTerms(None, Budget(), found)
