"""The price table and the tenants' budget settings, as the config file gives them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from comfyfleet.domain.budgets import Budget
from comfyfleet.fanout.request import ApiConfig
from comfyfleet.nodes.providers.bfl.nodes import BFLFluxImage
from comfyfleet.nodes.providers.openai_images.nodes import OpenAIImage
from comfyfleet.nodes.providers.openai_videos.nodes import OpenAIVideo
from comfyfleet.server.config import ConfigError, load_config
from comfyfleet.spend.budget import daily_budget
from comfyfleet.spend.prices import DEFAULT_PRICES, PaidJob, PriceTable, parse_prices


def test_defaults_price_every_model_the_provider_nodes_offer() -> None:
    from comfyfleet.nodes.providers.bfl.nodes import MODELS

    assert set(MODELS) <= set(DEFAULT_PRICES["bfl"])
    table = PriceTable()
    assert table.cost(PaidJob("bfl", "flux-pro-1.1")) == 0.04
    assert table.cost(PaidJob("bfl", "no-such-model")) is None
    assert table.cost(PaidJob("elsewhere", "x")) is None


def test_videos_are_priced_per_second() -> None:
    table = PriceTable()
    assert table.cost(PaidJob("openai_videos", "sora-2", 8.0)) == pytest.approx(0.8)
    assert table.cost(PaidJob("openai", "gpt-image-1", 8.0)) == 0.04  # images: per job


def test_the_operators_table_merges_over_the_defaults() -> None:
    table = parse_prices({"bfl": {"flux-pro-1.1": 0.05, "flux-3": 1}, "relay": {"m": 0}})
    assert table.price("bfl", "flux-pro-1.1") == 0.05
    assert table.price("bfl", "flux-3") == 1.0
    assert table.price("bfl", "flux-dev") == 0.025  # a default left alone
    assert table.price("relay", "m") == 0.0
    assert parse_prices(None) == PriceTable()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([1], r"\[prices\] holds one table per provider"),
        ({"bfl": 0.04}, r"\[prices.bfl\] must be a table"),
        ({"bfl": {"m": "0.04"}}, "must be a number"),
        ({"bfl": {"m": True}}, "must be a number"),
        ({"bfl": {"m": -1}}, "from 0 to"),
    ],
)
def test_a_bad_price_is_refused(table: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_prices(table)


def test_each_provider_node_prices_its_jobs_as_it_sends_them() -> None:
    """PAID_JOB (read from the graph) and RemoteRequest.paid_job (at run time) agree."""
    api = ApiConfig("http://127.0.0.1:1")
    flux = {
        "prompt": "p",
        "resolution": "1 MP",
        "aspect_ratio": "1:1",
        "grounding": False,
        "safety_tolerance": 2,
        "seed": 1,
        "model": "flux-pro-1.1",
        "api_config": api,
    }
    image = {
        "prompt": "p",
        "model": "dall-e-3",
        "size": "auto",
        "quality": "auto",
        "response_format": "auto",
        "seed": 1,
        "api_config": api,
    }
    video = {
        "prompt": "p",
        "model": "sora-2-pro",
        "seconds": "12",
        "size": "1280x720",
        "seed": 1,
        "api_config": api,
    }
    cases: list[tuple[Any, dict[str, Any]]] = [
        (BFLFluxImage, flux),
        (OpenAIImage, image),
        (OpenAIVideo, video),
    ]
    for cls, inputs in cases:
        spec = cls.PAID_JOB
        seconds = 1.0 if spec.seconds_input is None else float(inputs[spec.seconds_input])
        declared = PaidJob(spec.provider, str(inputs[spec.model_input]), seconds)
        assert cls().remote_request(**inputs).paid_job() == declared


def test_tenants_budgets_are_read_and_checked(tmp_path: Path) -> None:
    config = tmp_path / "comfyfleet.toml"
    config.write_text(
        "[tenants.alice]\npaid_jobs_per_day = 40\nspend_per_day = 2.5\n"
        '[tenants.default]\npaid_jobs_per_day = 1\n[prices.bfl]\n"flux-2-pro" = 0.05\n'
    )
    loaded = load_config(config, env={})
    alice = loaded.shares.of("alice")
    assert (alice.paid_jobs_per_day, alice.spend_per_day) == (40, 2.5)
    assert daily_budget(loaded.shares, "alice") == Budget(40, 2.5)
    assert not daily_budget(loaded.shares, "zed").limited  # a cap is one tenant's
    assert loaded.prices.price("bfl", "flux-2-pro") == 0.05
    for bad, message in (
        ("paid_jobs_per_day = -1", "paid_jobs_per_day must be a whole number"),
        ("paid_jobs_per_day = 1.5", "paid_jobs_per_day must be a whole number"),
        ('spend_per_day = "5"', "spend_per_day must be a number"),
        ("spend_per_day = -5", "spend_per_day must be from 0"),
        ("daily_jobs = 5", "unknown keys"),
    ):
        config.write_text(f"[tenants.alice]\n{bad}\n")
        with pytest.raises(ConfigError, match=message):
            load_config(config, env={})
    config.write_text('[prices.bfl]\n"flux-2-pro" = "cheap"\n')
    with pytest.raises(ConfigError, match="must be a number"):
        load_config(config, env={})
