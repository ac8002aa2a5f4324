from __future__ import annotations

from comfyfleet.provider_http.redact import Redactor


def test_known_values_are_masked_longest_first() -> None:
    redactor = Redactor(["abc123secret", "abc123secret-extended", ""])
    assert redactor.text("key abc123secret-extended and abc123secret") == "key *** and ***"


def test_header_shaped_secrets_are_masked_without_being_known() -> None:
    redactor = Redactor()
    text = redactor.text(
        'Authorization: Bearer tok.en-1 x-key: k1 {"x-key": "k2"} api-key=k3 sk-' + "a" * 20
    )
    for secret in ("tok.en-1", "k1", "k2", "k3", "sk-" + "a" * 20):
        assert secret not in text
    assert "Bearer ***" in text
    assert "x-key: ***" in text


def test_query_strings_in_text_are_masked() -> None:
    text = Redactor().text("GET https://cdn.example/img.png?sig=abc&se=1 failed")
    assert text == "GET https://cdn.example/img.png?*** failed"


def test_url_keeps_scheme_host_port_and_path_only() -> None:
    redactor = Redactor(["s3cret"])
    assert redactor.url("https://u:pw@cdn.example:8443/a/b.png?sig=1#x") == (
        "https://cdn.example:8443/a/b.png"
    )
    assert redactor.url("http://h/v1/s3cret/x?key=s3cret") == "http://h/v1/***/x"
    assert redactor.url("no-scheme/path?sig=1") == "no-scheme/path"


def test_including_leaves_the_original_unchanged() -> None:
    base = Redactor(["one-secret"])
    more = base.including("two-secret")
    assert more.text("one-secret two-secret") == "*** ***"
    assert base.text("two-secret") == "two-secret"
