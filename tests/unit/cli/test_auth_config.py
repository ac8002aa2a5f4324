"""Authentication settings: tokens from the config file, token files, variables and flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfyfleet.server.access.auth import TokenTable
from comfyfleet.server.config import AuthToken, ConfigError, load_config
from comfyfleet.server.delivery.client_events import client_key


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_auth_is_off_by_default() -> None:
    config = load_config(env={})
    assert config.auth_tokens == () and not config.auth_enabled


def test_tokens_from_every_source(tmp_path: Path) -> None:
    write(tmp_path / "bob.token", "\n  bob-secret-token  \nignored second line\n")
    config_file = write(
        tmp_path / "server.toml",
        """
[[auth.tokens]]
token = "alice-secret-token"
tenant = "alice"

[[auth.tokens]]
token_file = "bob.token"
tenant = "bob"
admin = true
""",
    )
    config = load_config(config_file, env={"COMFYFLEET_AUTH_TOKEN": "env-secret-token"})
    assert config.auth_tokens == (
        AuthToken("alice-secret-token", "alice", admin=False),
        AuthToken("bob-secret-token", "bob", admin=True),  # the file's path is relative
        AuthToken("env-secret-token", "default", admin=True),
    )
    assert config.auth_enabled


def test_flags_win_over_the_variable(tmp_path: Path) -> None:
    token_file = write(tmp_path / "t", "file-secret-token\n")
    env = {"COMFYFLEET_AUTH_TOKEN": "env-secret-token"}
    flags = {"auth_token": ["flag-one", "flag-two"], "auth_token_file": token_file}
    config = load_config(env=env, overrides=flags)
    assert [(t.token, t.tenant, t.admin) for t in config.auth_tokens] == [
        ("flag-one", "default", True),
        ("flag-two", "default", True),
        ("file-secret-token", "default", True),
    ]
    env_file = {"COMFYFLEET_AUTH_TOKEN_FILE": str(token_file)}
    assert [t.token for t in load_config(env=env_file).auth_tokens] == ["file-secret-token"]


def test_tokens_never_show_in_a_repr(tmp_path: Path) -> None:
    config = load_config(env={}, overrides={"auth_token": ["very-secret-token-value"]})
    assert "very-secret-token-value" not in repr(config)
    assert "very-secret-token-value" not in repr(TokenTable(config.auth_tokens))


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[[auth.tokens]]\ntoken = "x"\ntenant = "../etc"\n', "bad tenant name"),
        ('[[auth.tokens]]\ntoken = "x"\ntenant = ""\n', "bad tenant name"),
        (f'[[auth.tokens]]\ntoken = "x"\ntenant = "{"a" * 65}"\n', "bad tenant name"),
        ('[[auth.tokens]]\ntenant = "a"\n', "token or token_file"),
        ('[[auth.tokens]]\ntoken = "x"\ntoken_file = "f"\n', "token or token_file"),
        ('[[auth.tokens]]\ntoken = "x"\nadmin = "yes"\n', "admin must be"),
        ('[[auth.tokens]]\ntoken = "x"\nrole = "a"\n', "only token"),
        ('[[auth.tokens]]\ntoken = ""\n', "empty auth token"),
        ('[[auth.tokens]]\ntoken = "a b"\n', "blanks"),
        ('[[auth.tokens]]\ntoken_file = "missing"\n', "cannot read token file"),
        ('[auth]\ntoken = "x"\n', r"only \[\[auth\.tokens\]\]"),
        (
            '[[auth.tokens]]\ntoken = "x"\ntenant = "a"\n[[auth.tokens]]\ntoken = "x"\n'
            'tenant = "b"\n',
            "two tenants",
        ),
        ('output_mode = "reference"\n[[auth.tokens]]\ntoken = "x"\n', "reference"),
    ],
)
def test_unusable_auth_settings_are_refused(tmp_path: Path, toml: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path / "server.toml", toml), env={})


def test_token_table_finds_tenants_and_redacts_argv() -> None:
    table = TokenTable(
        [AuthToken("tok-alice", "alice"), AuthToken("tok-root", "default", admin=True)]
    )
    alice, root = table.lookup("tok-alice"), table.lookup("tok-root")
    assert alice is not None and (alice.name, alice.admin) == ("alice", False)
    assert root is not None and (root.name, root.admin) == ("default", True)
    assert table.lookup("tok-alic") is None and table.lookup("") is None
    argv = ["comfyfleet", "serve", "--auth-token", "tok-root", "--auth-token=tok-alice", "--x=y"]
    assert table.redact(argv) == [
        "comfyfleet",
        "serve",
        "--auth-token",
        "***",
        "--auth-token=***",
        "--x=y",
    ]
    assert not TokenTable([]) and table.tenants() == ["alice", "default"]


def test_client_keys_name_one_tenant_and_client_each() -> None:
    pairs = [
        ("default", "c1"),
        ("default", "alice\x00c1"),
        ("alice", "c1"),
        ("alice", "\x00c1"),
        ("bob", "c1"),
    ]
    keys = [client_key(tenant, client) for tenant, client in pairs]
    assert len(set(keys)) == len(keys)
    assert client_key("default", "c1") == "c1"  # without auth: the client id itself
