"""Where saved images go: prefix formatting, the target folder, unique file names."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from comfyfleet.engine.file_counters import FILE_COUNTERS
from comfyfleet.engine.services import ServiceKey, optional_service
from comfyfleet.folders import UnsafePath, resolve_inside

_VARIABLE = re.compile(r"%([^%]+)%")
_DATE_FIELD = re.compile(r"y+|M+|d+|h+|m+|s+")


def _format_date(pattern: str, now: datetime) -> str:
    """`yyyy-MM-dd hh:mm:ss`-style patterns, as ComfyUI's `%date:...%` understands them."""

    def field(match: re.Match[str]) -> str:
        token = match.group(0)
        if token[0] == "y":
            year = str(now.year)
            return year if len(token) >= 4 else year[-len(token) :].zfill(len(token))
        value = {"M": now.month, "d": now.day, "h": now.hour, "m": now.minute, "s": now.second}
        return str(value[token[0]]).zfill(len(token))

    return _DATE_FIELD.sub(field, pattern)


def _widget_value(prompt: Any, node: str, widget: str) -> Any:
    """A literal input of the prompt node titled (or, failing that, of class) `node`."""
    if not isinstance(prompt, dict):
        return None
    nodes = [n for n in prompt.values() if isinstance(n, dict)]
    titled = [n for n in nodes if (n.get("_meta") or {}).get("title") == node]
    for candidate in titled or [n for n in nodes if n.get("class_type") == node]:
        value = (candidate.get("inputs") or {}).get(widget)
        # A list is a link to another node's output, not a widget value.
        if value is not None and not isinstance(value, list):
            return value
    return None


def format_prefix(
    prefix: str, *, width: int, height: int, prompt: Any = None, now: datetime | None = None
) -> str:
    """Expand `%date:FMT%`, `%Node title.widget%`, `%width%`, `%height%`, `%year%` and the like.

    Unknown variables (such as `%batch_num%`, expanded per image) are left as they are.
    """
    if "%" not in prefix:
        return prefix
    moment = now or datetime.now()
    simple = {
        "width": str(width),
        "height": str(height),
        "year": str(moment.year),
        "month": f"{moment.month:02}",
        "day": f"{moment.day:02}",
        "hour": f"{moment.hour:02}",
        "minute": f"{moment.minute:02}",
        "second": f"{moment.second:02}",
    }

    def expand(match: re.Match[str]) -> str:
        key = match.group(1)
        if key.startswith("date:"):
            return _format_date(key[len("date:") :], moment)
        if key in simple:
            return simple[key]
        node, dot, widget = key.rpartition(".")
        value = _widget_value(prompt, node, widget) if dot else None
        return match.group(0) if value is None else str(value)

    return _VARIABLE.sub(expand, prefix)


#: The engine service naming saved files on every gateway of a shared store at once.
SHARED_COUNTERS: ServiceKey[SharedCounters] = ServiceKey("shared_file_counters")
#: Counters from here on are a gateway's spares (taken while its store does not answer):
#: a folder's own numbering goes on below them.
SPARE_COUNTERS_FROM = 10**9


class SharedCounters(Protocol):
    def reserve(self, folder: Path, name: str, floor: int, count: int) -> int:
        """The first of `count` counters for `name` in `folder`, none below `floor`,
        never one another gateway was given for the same folder and name."""


#: The counter after `<name>_` in a saved file's name.
_COUNTER = re.compile(r"(\d+)(?=_|\.|$)")


@dataclass(frozen=True)
class SaveTarget:
    """The folder and base name a filename prefix points at, inside a root folder."""

    folder: Path
    name: str
    subfolder: str

    @classmethod
    def resolve(cls, root: Path, prefix: str) -> SaveTarget:
        """Split `prefix` ("a/b/name") into subfolder and name; refuse anything outside
        `root` (symlinks resolved: a linked subfolder leading out of it too)."""
        subfolder, name = os.path.split(os.path.normpath(prefix))
        try:
            folder = resolve_inside(root, subfolder)
        except UnsafePath as exc:
            raise ValueError(
                f"Saving outside the {Path(root).name} folder is not allowed: "
                f"filename prefix {prefix!r}"
            ) from exc
        return cls(folder, name, subfolder)

    def next_counter(self, count: int = 1) -> int:
        """Reserve `count` counters past the highest used by `<name>_<counter>` files.

        The folder is scanned once per (folder, name) per engine; later calls take
        the next block from memory (`FILE_COUNTERS`), so saving stays O(1) however full
        the folder gets. Names are still claimed exclusively in `write_new`, so a file
        made by another process is never replaced.
        """
        key = (str(self.folder), self.name)
        counters = optional_service(FILE_COUNTERS)
        start = self._scan() if counters is None else counters.take(key, count, self._scan)
        shared = optional_service(SHARED_COUNTERS)
        if shared is not None:  # other gateways name files too: the store hands them out
            start = shared.reserve(self.folder, self.name, start, count)
            if start < SPARE_COUNTERS_FROM and counters is not None:
                counters.raise_to(key, start + count)
        return start

    def _scan(self) -> int:
        try:
            entries = os.listdir(self.folder)
        except FileNotFoundError:
            self.folder.mkdir(parents=True, exist_ok=True)
            return 1
        # The name is matched as a prefix, not compiled into a pattern: compiling a
        # pattern from a very long prefix (a 10 MB string) takes minutes.
        start = self.name + "_"
        matches = (_COUNTER.match(e, len(start)) for e in entries if e.startswith(start))
        used = [int(m.group(1)) for m in matches if m]
        return max((n for n in used if n < SPARE_COUNTERS_FROM), default=0) + 1

    def write_new(
        self, name: str, counter: int, data: bytes, suffix: str = "png"
    ) -> tuple[str, int]:
        """Write `data` to the first free `<name>_<counter:05>_.<suffix>`, never replacing a
        file.

        Each name is claimed with an exclusive create, so concurrent writers (threads or
        processes) that start from the same counter each end up with their own file.
        Returns the file name and the counter it used.
        """
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
        while True:
            filename = f"{name}_{counter:05}_.{suffix}"
            path = self.folder / filename
            try:
                fd = os.open(path, flags, 0o666)
            except FileExistsError:
                counter += 1
                continue
            try:
                with os.fdopen(fd, "wb") as file:
                    file.write(data)
            except BaseException:
                path.unlink(missing_ok=True)
                raise
            counters = optional_service(FILE_COUNTERS)
            if counters is not None:
                counters.raise_to((str(self.folder), name), counter + 1)
            return filename, counter
