"""A prompt's allowance: the part of its budgets a gateway grants a prompt it sends to a
backend (`extra_data.comfyfleet_allowance`). The backend counts the prompt's paid jobs
in its own journal and refuses the one that would pass the allowance, as it refuses one
past a budget (see comfyfleet.spend.holds for the gateway's side).

An allowance only ever limits: a client that sets one on its own prompt limits itself.
It carries the gateway's price table, so both count a job's cost alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from comfyfleet.domain.budgets import ALLOWANCE_KEY, Budget
from comfyfleet.spend.budget import BadBudget, parse_budget
from comfyfleet.spend.prices import PriceTable, parse_prices

#: Models an allowance's price table may name (the gateway's table is far smaller).
MAX_PRICED_MODELS = 2000
MAX_NAME = 200


@dataclass(frozen=True)
class Allowance:
    budget: Budget
    prices: PriceTable | None = None  # None: the backend's own table

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"paid_jobs": self.budget.paid_jobs, "spend": self.budget.spend}
        if self.prices is not None:
            found["prices"] = {name: dict(models) for name, models in self.prices.prices.items()}
        return found


def allowance_of(extra_data: Any) -> Allowance | None:
    """The allowance in a prompt's `extra_data`, or None; BadBudget says what is wrong."""
    raw = extra_data.get(ALLOWANCE_KEY) if isinstance(extra_data, dict) else None
    if raw is None:
        return None
    where = f"extra_data.{ALLOWANCE_KEY}"
    if not isinstance(raw, dict):
        raise BadBudget(f"{where} must be an object with paid_jobs, spend and prices")
    if set(raw) - {"paid_jobs", "spend", "prices"}:
        raise BadBudget(f"{where} takes only paid_jobs, spend and prices")
    prices = raw.get("prices")
    return Allowance(parse_budget(raw, where), None if prices is None else _prices(prices, where))


def _prices(table: Any, where: str) -> PriceTable:
    if (
        not isinstance(table, dict)
        or sum(len(models) if isinstance(models, dict) else 1 for models in table.values())
        > MAX_PRICED_MODELS
    ):
        raise BadBudget(f"{where}.prices must be a table of at most {MAX_PRICED_MODELS} prices")
    names = [*table, *(m for models in table.values() if isinstance(models, dict) for m in models)]
    if any(not isinstance(name, str) or len(name) > MAX_NAME for name in names):
        raise BadBudget(
            f"{where}.prices names providers and models of at most {MAX_NAME} characters"
        )
    try:
        return parse_prices(table)
    except ValueError as exc:
        raise BadBudget(f"{where}.prices: {exc}") from None
