"""Webhook settings from the config file and the environment."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from comfyfleet.domain.webhooks import WebhookEvent
from comfyfleet.server.config import ConfigError, load_config
from comfyfleet.server.gateway import webhook_settings

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "comfyfleet.toml"
    path.write_text(text)
    return path


def test_webhook_tables_and_settings_are_read(tmp_path: Path) -> None:
    (tmp_path / "hook.secret").write_text(SECRET + "\n")
    path = config_file(
        tmp_path,
        'webhooks_retry_for = "15m"\nwebhooks_timeout = 3\npublic_url = "https://f.example/"\n'
        '[[webhooks]]\nname = "billing"\nurl = "https://b.example/in"\n'
        'secret_file = "hook.secret"\nevents = ["job.failed"]\ntenants = ["acme"]\n'
        '[[webhooks]]\nurl = "http://10.0.0.5/in"\nsecret = "' + SECRET + '"\n',
    )
    config = load_config(path, env={"COMFYFLEET_WEBHOOKS_ALLOW_PRIVATE": "1"})
    billing, internal = config.webhooks
    assert billing.target.name == "billing" and billing.key == b"k" * 32
    assert billing.target.events == frozenset({WebhookEvent.FAILED})
    assert billing.target.tenants == frozenset({"acme"})
    assert internal.target.name.startswith("webhook-") and internal.target.events is None
    assert config.webhooks_allow_private and config.webhooks_retry_for == 900.0
    settings = webhook_settings(config)
    assert settings.enabled and settings.key is None and settings.timeout == 3.0
    assert settings.view_base == "https://f.example"
    assert SECRET not in repr(config) and SECRET not in repr(settings)


def test_the_prompts_secret_comes_from_a_file_or_the_environment(tmp_path: Path) -> None:
    (tmp_path / "s").write_text(SECRET)
    by_file = load_config(None, env={"COMFYFLEET_WEBHOOKS_SECRET_FILE": str(tmp_path / "s")})
    by_env = load_config(None, env={"COMFYFLEET_WEBHOOKS_SECRET": SECRET})
    assert by_file.webhooks_secret == by_env.webhooks_secret == SECRET
    assert webhook_settings(by_env).key == b"k" * 32
    assert not webhook_settings(load_config(None, env={})).enabled


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[webhooks]]\nurl = "https://x.example"\nsecret = "nope-secret"\n', "whsec_"),
        ('[[webhooks]]\nurl = "https://x.example"\nsecret = "whsec_c2hvcnQ="\n', "24 to 64"),
        ('[[webhooks]]\nurl = "ftp://x.example"\nsecret = "S"\n', "http or https"),
        ('[[webhooks]]\nurl = "https://x.example"\n', "secret or secret_file"),
        ('[[webhooks]]\nurl = "https://x.example"\nsecret = "S"\nevents = ["job.x"]\n', "unknown"),
        ('[[webhooks]]\nurl = "https://x.example"\nsecret = "S"\nheaders = 1\n', "only"),
        ('[[webhooks]]\nurl = "https://x.example"\nsecret = "S"\ntenants = ["a b"]\n', "tenant"),
        (
            '[[webhooks]]\nname = "a"\nurl = "https://x.example"\nsecret = "S"\n'
            '[[webhooks]]\nname = "a"\nurl = "https://y.example"\nsecret = "S"\n',
            "one name",
        ),
        ('webhooks_secret = "whsec_!!"\n', "base64"),
        ("webhooks_timeout = 0\n", "webhooks_timeout"),
        ('public_url = "fleet.example"\n', "public_url"),
    ],
)
def test_bad_webhook_settings_are_refused_without_showing_secrets(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(config_file(tmp_path, text.replace('"S"', f'"{SECRET}"')), env={})
    assert message in str(refused.value)
    assert "nope-secret" not in str(refused.value) and SECRET not in str(refused.value)
