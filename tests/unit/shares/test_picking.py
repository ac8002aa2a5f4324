"""The order in which backlogged tenants' jobs are tried: classes, then use per weight,
then the longer wait; caps leave a tenant out; an idle tenant takes no share."""

from __future__ import annotations

import math

import pytest

from comfyfleet.domain.shares import TenantCounts
from comfyfleet.shares.picking import Usage, order, rank
from comfyfleet.shares.policy import SharePolicy, TenantPolicy, parse_policy

NOW = 1000.0


def counts(**pending: int) -> dict[str, TenantCounts]:
    return {t: TenantCounts(pending=n, oldest=NOW - 1) for t, n in pending.items()}


def test_less_use_per_weight_goes_first() -> None:
    policy = SharePolicy({"a": TenantPolicy(weight=3.0)})
    used = {"a": 30.0, "b": 9.0}  # a: 10 per weight, b: 9
    assert order(counts(a=5, b=5), used.__getitem__, policy, NOW) == ["b", "a"]
    used = {"a": 24.0, "b": 9.0}  # a: 8 per weight
    assert order(counts(a=5, b=5), used.__getitem__, policy, NOW) == ["a", "b"]


def test_idle_and_capped_tenants_take_no_turn() -> None:
    policy = SharePolicy({"a": TenantPolicy(max_running=2)})
    loads = {"a": TenantCounts(5, 2, NOW), "b": TenantCounts(0, 0), "c": TenantCounts(1, 9, NOW)}
    assert order(loads, lambda _t: 0.0, policy, NOW) == ["c"]
    loads["a"].running = 1
    assert set(order(loads, lambda _t: 0.0, policy, NOW)) == {"a", "c"}


def test_a_higher_class_goes_first_and_a_lower_one_rises_as_it_waits() -> None:
    policy = SharePolicy({"hi": TenantPolicy(priority="high"), "lo": TenantPolicy(priority="low")})
    loads = {"hi": TenantCounts(9, 0, NOW - 1), "lo": TenantCounts(1, 0, NOW - 1)}
    used = {"hi": 100.0, "lo": 0.0}
    assert order(loads, used.__getitem__, policy, NOW) == ["hi", "lo"]
    loads["lo"].oldest = NOW - policy.aging  # one step up: normal, still below high
    assert order(loads, used.__getitem__, policy, NOW) == ["hi", "lo"]
    loads["lo"].oldest = NOW - 2 * policy.aging  # high now: shares decide
    assert order(loads, used.__getitem__, policy, NOW) == ["lo", "hi"]
    assert rank(policy, "lo", math.inf) == 0  # nothing waiting: its own class


def test_use_fades_with_the_window() -> None:
    usage = Usage(window=60.0)
    usage.add("a", 10.0, 0.0)
    assert usage.of("a", 0.0) == pytest.approx(10.0)
    assert usage.of("a", 60.0) == pytest.approx(10.0 / math.e)
    usage.forget_below(1.0, 600.0)
    assert usage.of("a", 600.0) == 0.0


def test_unnamed_tenants_get_the_default_tables_weight_but_not_its_caps() -> None:
    policy = parse_policy(
        {"default": {"weight": 2, "max_running": 1, "priority": "low"}}, {"aging": "2m"}
    )
    assert policy.of("someone") == TenantPolicy(weight=2.0, priority="low")
    assert policy.of("default").max_running == 1
    assert policy.aging == 120.0


@pytest.mark.parametrize(
    ("tenants", "message"),
    [
        ({"a": {"weight": 0}}, "weight"),
        ({"a": {"weight": True}}, "weight"),
        ({"a": {"max_running": -1}}, "max_running"),
        ({"a": {"max_queued": 1.5}}, "max_queued"),
        ({"a": {"priority": "urgent"}}, "priority"),
        ({"a": {"lanes": "local"}}, "lanes"),
        ({"a": {"wieght": 2}}, "unknown keys"),
        ({"a/b": {}}, "bad tenant name"),
        ({"a": 3}, "table"),
    ],
)
def test_bad_tables_are_named(tenants: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_policy(tenants, None)


def test_fair_share_can_be_turned_off_and_its_table_is_checked() -> None:
    assert parse_policy(None, {"enabled": False}).enabled is False
    assert parse_policy(None, None).enabled is True
    for bad in ({"enabled": "no"}, {"window": "soon"}, {"aging": 0.5}, {"speed": 1}):
        with pytest.raises(ValueError, match=r"\[fair_share\]"):
            parse_policy(None, bad)
