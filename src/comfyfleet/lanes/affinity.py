"""Affinity: which free backend should take a job.

A backend that already loaded a prompt's model files (checkpoints, LoRAs, ...)
starts it without a model load; among those, one that ran a prompt with the
same leading nodes may still hold their outputs in its cache. The scheduler
only uses this to choose between lanes that are free at the same moment; it
never leaves a lane idle while a job it can run waits.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any

from comfyfleet.protocol.prompt import is_link

MODEL_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".gguf", ".sft", ".onnx")
#: Root nodes fingerprinted per prompt: enough to tell shared prefixes apart, and a
#: prompt of thousands of constants costs no more than this to start.
MAX_ROOTS = 64
#: Nodes looked at for model files: a prompt of many thousands costs no more to start.
MAX_NODES = 1_000


def model_files(prompt: dict[str, Any]) -> frozenset[str]:
    """Constant inputs that name model files (in the first MAX_NODES nodes)."""
    return frozenset(
        value
        for node in itertools.islice(prompt.values(), MAX_NODES)
        for value in (node.get("inputs") or {}).values()
        if isinstance(value, str) and value.lower().endswith(MODEL_SUFFIXES)
    )


def root_nodes(prompt: dict[str, Any]) -> frozenset[str]:
    """Fingerprints of nodes with no links, where a shared graph prefix begins: the first
    MAX_ROOTS of them."""
    prints = set()
    for node in prompt.values():
        inputs = node.get("inputs") or {}
        if any(is_link(v) for v in inputs.values()):
            continue
        text = json.dumps([node.get("class_type"), inputs], sort_keys=True, default=str)
        prints.add(hashlib.sha1(text.encode()).hexdigest()[:16])
        if len(prints) >= MAX_ROOTS:
            break
    return frozenset(prints)


@dataclass(frozen=True)
class Warmth:
    """What a lane ran last: its model files and root-node fingerprints."""

    models: frozenset[str] = frozenset()
    roots: frozenset[str] = frozenset()

    @classmethod
    def of(cls, prompt: dict[str, Any]) -> Warmth:
        return cls(model_files(prompt), root_nodes(prompt))

    def marks(self) -> frozenset[str]:
        """What a lane can be warm for: its model files and root nodes, told apart."""
        return frozenset({f"m:{m}" for m in self.models} | {f"r:{r}" for r in self.roots})

    def best(self) -> tuple[int, int]:
        """The score of a lane that ran just what this prompt wants: none beats it."""
        return len(self.models), len(self.roots)

    def score(self, wanted: Warmth) -> tuple[int, int]:
        """(shared model files, shared root nodes) with what a prompt `wanted` (its own
        Warmth): higher is better, compared in order."""
        return len(self.models & wanted.models), len(self.roots & wanted.roots)
