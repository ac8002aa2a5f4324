"""A run's cache side: each node signed once (the prompt's, then each expansion's), and
the nodes whose signature the output cache holds taken as hits, not run again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from comfyfleet.engine.cache import CacheEntry, OutputCache
from comfyfleet.engine.calls import call_arguments, gather_inputs
from comfyfleet.engine.dynamic import DynamicPrompt
from comfyfleet.engine.nodedef import InputTypes, NodeDef
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.engine.signature import changed_token, signatures
from comfyfleet.protocol.prompt import LARGE_PROMPT_NODES

InThread = Callable[[Callable[[], Any]], Awaitable[Any]]


class CacheLookup:
    def __init__(
        self,
        registry: NodeRegistry,
        cache: OutputCache,
        dynprompt: DynamicPrompt,
        extra_data: dict[str, Any],
        node_of: Callable[[str], NodeDef],
        types_of: Callable[[str], InputTypes],
    ) -> None:
        self.registry = registry
        self.cache = cache
        self.dynprompt = dynprompt
        self.nodes = dynprompt.nodes
        self.extra_data = extra_data
        self.node_of = node_of
        self.types_of = types_of
        self.sigs: dict[str, str] = {}
        self.hits: dict[str, CacheEntry] = {}

    async def look_up(self, node_ids: list[str], in_thread: InThread) -> dict[str, CacheEntry]:
        """Sign `node_ids`; their hits, also kept in `hits`.

        Signing runs IS_CHANGED (node code) and walks every node: in one worker-thread
        hop when there is node code to run or many nodes to walk."""
        if len(node_ids) > LARGE_PROMPT_NODES or self._any_changed(node_ids):
            await in_thread(lambda: self._sign(node_ids))
        else:
            self._sign(node_ids)
        found: dict[str, CacheEntry] = {}
        for node_id in node_ids:
            entry = self.cache.get(self.sigs[node_id])
            if entry is not None:
                found[node_id] = self.hits[node_id] = entry
        return found

    def put(self, node_id: str, outputs: list[list[Any]], ui: dict[str, Any] | None) -> None:
        self.cache.put(self.sigs[node_id], CacheEntry(outputs, ui))

    def _any_changed(self, node_ids: list[str]) -> bool:
        return any(self.node_of(n).is_changed is not None for n in node_ids)

    def _sign(self, node_ids: list[str]) -> None:
        changed = self._changed_tokens(node_ids)
        signatures(self.registry, self.nodes, node_ids, changed, self.sigs)

    def _changed_tokens(self, node_ids: list[str]) -> dict[str, str]:
        """What the `IS_CHANGED` of `node_ids` say (node code: in a worker thread)."""
        tokens: dict[str, str] = {}
        for node_id in node_ids:
            node = self.node_of(node_id)
            if node.is_changed is None:
                continue
            try:
                values = gather_inputs(
                    node_id,
                    self.nodes[node_id].get("inputs", {}),
                    self.types_of(node_id),
                    {},
                    self.dynprompt,
                    self.extra_data,
                ).values
                calls = call_arguments(values, node.input_is_list)
                results = [node.is_changed(**kw) for kw in calls]
                tokens[node_id] = changed_token(results[0] if len(results) == 1 else results)
            except Exception:
                tokens[node_id] = changed_token(float("nan"))
        return tokens
