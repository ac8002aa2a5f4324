"""The machine-readable figure line every benchmark prints next to its human-readable output.

One line per figure, tab-separated, so `bench/run_all.py` (or grep/awk) can collect them:

    FIGURE<TAB>name<TAB>value<TAB>unit<TAB>baseline<TAB>ratio

- name: a short identifier, unique within its benchmark (no tabs or spaces);
- value: the measured number (`%.6g`);
- unit: e.g. ms, prompts/s, ops/s, s, MiB, count, x (a plain ratio);
- baseline: the same quantity measured in the same run under the baseline
  condition the benchmark describes, or `-` when it has none;
- ratio: value / baseline, or `-`.
"""

from __future__ import annotations

import math

PREFIX = "FIGURE"


def _number(value: float) -> str:
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return str(value)
    return "nan" if math.isnan(value) else f"{value:.6g}"


def figure(name: str, value: float, unit: str, baseline: float | None = None) -> str:
    """Print (and return) one FIGURE line; the ratio is value / baseline when both exist."""
    if any(c.isspace() for c in name) or any(c.isspace() for c in unit):
        raise ValueError(f"figure name and unit must have no whitespace: {name!r} {unit!r}")
    ratio = "-"
    base = "-"
    if baseline is not None:
        base = _number(baseline)
        if baseline and not math.isnan(baseline) and not math.isnan(value):
            ratio = f"{value / baseline:.3g}"
    line = "\t".join((PREFIX, name, _number(value), unit, base, ratio))
    print(line, flush=True)
    return line


def parse(line: str) -> dict[str, str] | None:
    """The fields of a FIGURE line, or None for any other line."""
    parts = line.rstrip("\n").split("\t")
    if len(parts) != 6 or parts[0] != PREFIX:
        return None
    return dict(zip(("name", "value", "unit", "baseline", "ratio"), parts[1:]))
