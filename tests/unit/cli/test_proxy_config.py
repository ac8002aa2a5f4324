"""The `trusted_proxies` setting: addresses and CIDR networks from the file, the variable
or the flag (`--trusted-proxy`, repeatable); anything else is refused."""

from __future__ import annotations

from ipaddress import ip_network
from pathlib import Path

import pytest

from comfyfleet.cli import build_parser
from comfyfleet.cli.serve import serve_main
from comfyfleet.server.config import ConfigError, load_config


def test_proxies_come_from_the_file_the_variable_or_the_flag(tmp_path: Path) -> None:
    assert load_config(env={}).trusted_proxies == ()
    config_file = tmp_path / "server.toml"
    config_file.write_text('trusted_proxies = ["10.0.0.5", "fd00::/8"]\n', encoding="utf-8")
    assert load_config(config_file, env={}).trusted_proxies == (
        ip_network("10.0.0.5/32"),
        ip_network("fd00::/8"),
    )
    env = {"COMFYFLEET_TRUSTED_PROXIES": "127.0.0.1, 172.16.0.0/12"}
    assert load_config(config_file, env=env).trusted_proxies == (
        ip_network("127.0.0.1/32"),
        ip_network("172.16.0.0/12"),
    )
    args = build_parser().parse_args(
        ["serve", "--trusted-proxy", "192.0.2.1", "--trusted-proxy", "::1"]
    )
    flags = {"trusted_proxies": args.trusted_proxies}
    assert load_config(config_file, env=env, overrides=flags).trusted_proxies == (
        ip_network("192.0.2.1/32"),
        ip_network("::1/128"),
    )


@pytest.mark.parametrize("bad", ["proxy.example", "10.0.0.5/8", "10.0.0.0/33", "*"])
def test_anything_but_addresses_and_networks_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"trusted_proxies: .* is not an IP address or network"):
        load_config(env={"COMFYFLEET_TRUSTED_PROXIES": bad})


def test_the_flag_reaches_the_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(
        ["serve", "--data-dir", str(tmp_path), "--trusted-proxy", "proxy.example"]
    )
    assert serve_main(args) == 2
    assert "trusted_proxies: 'proxy.example'" in capsys.readouterr().err
