"""What a paid job costs: the operator's `[prices]` table over documented estimates.

`[prices.PROVIDER] "MODEL" = PRICE` in US dollars. Image providers are priced per job
(one image); video providers (`PER_SECOND`) per second of video asked for. The defaults
are estimates from the providers' public price lists (December 2026) at their smallest
common settings (FLUX.2 at 1 MP, OpenAI images at 1024x1024 medium quality): the bill is
the provider's, and the table is the operator's to correct.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Providers whose prices are per second of video (the job asks for `seconds`).
PER_SECOND = frozenset({"openai_videos"})
MAX_PRICE = 1_000_000.0

DEFAULT_PRICES: Mapping[str, Mapping[str, float]] = {
    "bfl": {
        "flux-2-pro": 0.03,
        "flux-2-max": 0.07,
        "flux-2-flex": 0.05,
        "flux-kontext-pro": 0.04,
        "flux-kontext-max": 0.08,
        "flux-pro-1.1": 0.04,
        "flux-pro-1.1-ultra": 0.06,
        "flux-dev": 0.025,
    },
    "openai": {"gpt-image-1": 0.04, "dall-e-3": 0.04, "dall-e-2": 0.02},
    "openai_videos": {"sora-2": 0.10, "sora-2-pro": 0.30},
}


@dataclass(frozen=True)
class PaidJob:
    """One paid job as a price sees it: who runs it, which model, and how many units
    (1 for an image; seconds for a video)."""

    provider: str
    model: str
    units: float = 1.0


@dataclass(frozen=True)
class PaidJobSpec:
    """On a provider node class (`PAID_JOB`): its jobs' provider, and the inputs that name
    the model and (videos) the seconds, so a prompt's cost is known before it runs. It
    must agree with the node's `remote_request` (see `RemoteRequest.paid_job`)."""

    provider: str
    model_input: str = "model"
    seconds_input: str | None = None


@dataclass(frozen=True)
class PriceTable:
    prices: Mapping[str, Mapping[str, float]] = field(default_factory=lambda: DEFAULT_PRICES)

    def price(self, provider: str, model: str) -> float | None:
        return self.prices.get(provider, {}).get(model)

    def cost(self, job: PaidJob) -> float | None:
        """The job's cost, or None when the table has no price for its model."""
        price = self.price(job.provider, job.model)
        if price is None:
            return None
        return price * (job.units if job.provider in PER_SECOND else 1.0)


def parse_prices(table: Any) -> PriceTable:
    """`[prices]` over the defaults (a provider's models merge; 0 makes one free);
    ValueError names what is wrong."""
    if table is None:
        return PriceTable()
    if not isinstance(table, dict):
        raise ValueError('[prices] holds one table per provider: [prices.bfl] "model" = 0.04')
    merged = {provider: dict(models) for provider, models in DEFAULT_PRICES.items()}
    for provider, models in table.items():
        if not isinstance(models, dict):
            raise ValueError(f"[prices.{provider}] must be a table of model = price")
        for model, price in models.items():
            if isinstance(price, bool) or not isinstance(price, int | float):
                raise ValueError(f"[prices.{provider}] {model!r} must be a number (US dollars)")
            if math.isnan(price) or not 0 <= price <= MAX_PRICE:
                raise ValueError(f"[prices.{provider}] {model!r} must be from 0 to {MAX_PRICE:g}")
            merged.setdefault(provider, {})[model] = float(price)
    return PriceTable(merged)
