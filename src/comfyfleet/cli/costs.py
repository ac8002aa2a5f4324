"""`comfyfleet validate --cost`: the paid jobs a workflow would send, and their cost."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

from comfyfleet.engine.executor import Engine
from comfyfleet.engine.validation import ValidationResult
from comfyfleet.spend.estimate import Estimate, estimate
from comfyfleet.spend.prices import PriceTable, parse_prices


def read_prices(config: Path | None) -> PriceTable:
    """The `[prices]` table of a config file over the estimates (the estimates alone
    without one); ValueError says what is wrong."""
    if config is None:
        return PriceTable()
    try:
        data = tomllib.loads(config.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read config file {config}: {exc}") from None
    return parse_prices(data.get("prices"))


def print_cost(checked: ValidationResult, engine: Engine, config: Path | None) -> int:
    """One line per provider and model on stderr, then the JSON on stdout (as
    `POST /comfyfleet/cost` answers, without the budgets: they are a server's)."""
    try:
        prices = read_prices(config)
    except ValueError as exc:
        print(f"comfyfleet: {exc}", file=sys.stderr)
        return 2
    planned = estimate(checked.prompt, checked.outputs, engine.registry, prices)
    for line in summary(planned):
        print(line, file=sys.stderr)
    print(json.dumps(planned.as_json(), indent=2))
    return 0


def summary(planned: Estimate) -> list[str]:
    body = planned.as_json()
    lines = [
        f"{job['provider']} {job['model'] or '(model from a link)'}: {job['count']} job(s), "
        + _dollars(job["cost"])
        for job in body["jobs"]
    ]
    total = f"total: {body['paid_jobs']} paid job(s), {_dollars(body['cost'])}"
    if body["unpriced_jobs"]:
        total += f" (${body['priced_cost']:.4f} for the jobs that have a price)"
    lines.append(total + " (estimated by the price table; the provider's bill decides)")
    if body["uncounted_nodes"]:
        nodes = ", ".join(f"#{node}" for node in body["uncounted_nodes"])
        lines.append(f"not counted: {nodes} (fed a list: one job per item, known as it runs)")
    return lines


def _dollars(cost: float | None) -> str:
    return "cost unknown" if cost is None else f"${cost:.4f}"
