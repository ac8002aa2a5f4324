"""Backend definitions: parsing, auth headers by reference, and redaction."""

from __future__ import annotations

import pytest

from comfyfleet.domain.backend_names import FleetError
from comfyfleet.lanes.fleet import parse_spec, spec_json


def test_a_url_alone_is_enough() -> None:
    spec = parse_spec("http://127.0.0.1:8188/")
    assert (spec.url, spec.name, spec.slots, spec.prefetch) == (
        "http://127.0.0.1:8188",
        "127.0.0.1-8188",
        1,
        0,
    )


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"url": "ftp://x"},
        {"url": "http://x", "name": "a b"},
        {"url": "http://x", "slots": 0},
        {"url": "http://x", "prefetch": -1},
        {"url": "http://x", "auth_header": "no colon"},
        {"url": "http://x", "slots": True},
        {"url": "http://x", "slots": 1.5},
        {"url": "http://x", "tags": ["a", 1]},
        {"url": "http://x", "name": 0},
        {"url": "http://x", "name": "x\n"},
        "http://x\n",
        "http://x/a\u3000b",
        "http://\x1cx",
    ],
)
def test_bad_definitions_are_refused_with_a_reason(raw: object) -> None:
    with pytest.raises(FleetError):
        parse_spec(raw)


def test_auth_header_by_reference_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPU0_TOKEN", "Bearer abc")
    spec = parse_spec({"url": "http://gpu0:8188", "auth_header": "Authorization: env:GPU0_TOKEN"})
    assert spec.auth_is_reference
    assert spec.headers() == {"Authorization": "Bearer abc"}
    assert spec_json(spec, secrets=True)["auth_header"] == "Authorization: env:GPU0_TOKEN"


def test_a_literal_auth_header_is_shown_redacted() -> None:
    spec = parse_spec({"url": "http://gpu0:8188", "auth_header": "X-Token: s3cret"})
    assert not spec.auth_is_reference
    assert spec.headers() == {"X-Token": "s3cret"}
    assert spec_json(spec)["auth_header"] == "X-Token: ***"


def test_integral_numbers_count_as_integers() -> None:
    """JSON Schema's integers include 2.0, which JSON parsers hand over as a float."""
    spec = parse_spec({"url": "http://x", "slots": 2.0, "prefetch": 0.0})
    assert (spec.slots, spec.prefetch) == (2, 0)
    assert isinstance(spec.slots, int)


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("http://gpu0:8188/", "gpu0-8188"),
        ("http://-gpu0", "gpu0"),
        ("http://" + "a" * 70, "a" * 64),
        ("http://--", "backend"),
    ],
)
def test_a_name_is_made_from_any_accepted_url(url: str, name: str) -> None:
    for raw in (url, {"url": url, "name": None}, {"url": url, "name": ""}):
        assert parse_spec(raw).name == name
