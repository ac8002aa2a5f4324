"""Backend definitions: parsing, auth headers by reference, and redaction."""

from __future__ import annotations

import pytest

from comfyfleet.lanes.fleet import FleetError, parse_spec, spec_json


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
