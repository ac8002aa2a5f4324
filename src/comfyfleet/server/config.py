"""Server settings: defaults, then a TOML file, then COMFYFLEET_* variables, then flags."""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from comfyfleet import durations
from comfyfleet.domain.gateways import DEFAULT_LEASE, GATEWAY_ID
from comfyfleet.domain.jobs import MAX_HOLD
from comfyfleet.errors import ComfyfleetError
from comfyfleet.shares.policy import SharePolicy, parse_policy
from comfyfleet.spend.prices import PriceTable, parse_prices
from comfyfleet.store.factory import check_store_location
from comfyfleet.tenants import DEFAULT_TENANT, check_tenant_name
from comfyfleet.workers.tokens import WorkerToken, WorkerTokenError, checked

if TYPE_CHECKING:
    from comfyfleet.managed.spec import ManagedGroup
    from comfyfleet.webhooks.settings import WebhookConfig

DEFAULT_MAX_UPLOAD = 100 * 1024 * 1024

ProxyNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class ConfigError(ComfyfleetError, ValueError):
    """A setting that cannot be used; the message names it."""


@dataclass(frozen=True)
class AuthToken:
    """A bearer token and the tenant it stands for. The token never shows in a repr."""

    token: str = field(repr=False)
    tenant: str = DEFAULT_TENANT
    admin: bool = False


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8188
    data_dir: Path = Path("data")
    local_slots: int = 8
    custom_nodes: tuple[Path, ...] = ()
    testing_nodes: bool = False
    max_pending: int = 10_000
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD
    # The largest prompt POST /prompt takes: its nodes, and its request body's bytes.
    max_prompt_nodes: int = 25_000
    max_prompt_bytes: int = 32 * 1024 * 1024
    history_max_entries: int | None = None
    history_max_age: float | None = None  # seconds
    # Seconds each prompt's events stay in the event log after its end (0: no log).
    events_retention: float = 3600.0
    # Bytes of one prompt's events past which only its results, ends and node starts
    # and finishes are logged (see server/event_log.py).
    events_max_prompt_bytes: int = 64 * 1024 * 1024
    shutdown_grace: float = 30.0
    cache_entries: int = 1024
    # SQLite durability: NORMAL (WAL) keeps every commit through a process crash or
    # kill -9; FULL also through power loss, at the cost of an fsync per commit batch.
    sqlite_synchronous: str = "NORMAL"
    # Where jobs and history live: a postgresql:// URL, or a SQLite file (None: the data
    # dir's). Left out of repr: a URL may hold a password.
    store: str | None = field(default=None, repr=False)
    # This gateway among those sharing one store (None: the id kept in the data dir), and
    # how long its lease on the jobs it runs holds without a heartbeat (seconds).
    gateway_id: str | None = None
    lease: float = DEFAULT_LEASE
    # ComfyUI backends: urls or tables {url, name, slots, prefetch, tags, auth_header}.
    backends: tuple[Any, ...] = ()
    # Managed backends: `[[comfyui]]` tables (or --comfyui DIR), processes the gateway runs.
    comfyui: tuple[ManagedGroup, ...] = ()
    hang_timeout: float = 300.0  # seconds without a frame from a backend's running prompt
    # A comfyfleet backend runs this gateway's prompts this long past its last word (the
    # gateway renews it every probe); a lost one's prompts move after that, not before.
    backend_hold: float = 30.0
    max_attempts: int = 3  # attempts per job before a lane failure is final
    # Backend output files: "copy" them into the data dir, or "reference" them there.
    output_mode: str = "copy"
    # Browser origins allowed to call the API across sites ("*" for any); none by default.
    cors_origins: tuple[str, ...] = ()
    # Reverse proxies (addresses, networks) whose Forwarded / X-Forwarded-Proto and
    # X-Forwarded-Host headers say the scheme and host the client used; none by default.
    trusted_proxies: tuple[ProxyNetwork, ...] = ()
    # Fan-out pools, shared by every prompt (COMFYFLEET_IMAGE_CONCURRENCY and so on).
    image_concurrency: int = 30
    image_pending: int = 30
    video_concurrency: int = 10
    video_pending: int = 10
    # A TOML file of `name = "key"` entries that API settings nodes name as secret:NAME.
    secrets_file: Path | None = None
    # Authentication: on when there is a token. `[[auth.tokens]]` in the file, and one
    # admin token of the `default` tenant from --auth-token(-file) / COMFYFLEET_AUTH_TOKEN(_FILE).
    auth_tokens: tuple[AuthToken, ...] = ()
    # The graph editor's files: a build of ComfyUI's frontend (None: comfyui-frontend-package).
    front_end_root: Path | None = None
    # Log lines: "text", or "json" (one object per line, with the job's fields).
    log_format: str = "text"
    # Webhooks: `[[webhooks]]` targets, and the secret (whsec_...) that signs the webhooks
    # prompts name themselves (extra_data.webhook_url); none without it.
    webhooks: tuple[WebhookConfig, ...] = ()
    webhooks_secret: str | None = field(default=None, repr=False)
    webhooks_secret_file: Path | None = None
    webhooks_allow_private: bool = False  # prompts' webhooks to loopback, private addresses
    webhooks_timeout: float = 10.0  # seconds per attempt
    webhooks_retry_for: float = 86400.0  # seconds of retries, then the dead-letter list
    webhooks_concurrency: int = 32
    # Where clients reach this server (the /view URLs in webhook bodies); None: host:port.
    public_url: str | None = None
    # Where the other gateways of a shared store reach this one (asking it for files);
    # None: http://host:port (this machine's name for a wildcard host).
    peer_url: str | None = None
    shares: SharePolicy = field(default_factory=SharePolicy)  # [tenants.*], [fair_share]
    # What paid jobs cost ([prices.PROVIDER] "MODEL" = dollars), over the estimates in
    # comfyfleet/spend/prices.py: for spend budgets and the cost dry run.
    prices: PriceTable = field(default_factory=PriceTable)
    # `[[worker_tokens]]`: what lets a `comfyfleet worker` connect (and nothing else).
    worker_tokens: tuple[WorkerToken, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)  # unknown keys, kept for later issues

    @property
    def database(self) -> Path:
        return self.data_dir / "comfyfleet.db"

    @property
    def auth_enabled(self) -> bool:
        return bool(self.auth_tokens)


def parse_duration(text: str) -> float:
    """`90`, `90s`, `15m`, `12h`, `30d`, `2w` to seconds."""
    try:
        return durations.parse_duration(text)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _seconds(value: Any) -> float:
    """A number of seconds, or a duration such as `12h`."""
    if isinstance(value, bool):
        raise ConfigError(f"not a duration: {value!r}")
    return float(value) if isinstance(value, int | float) else parse_duration(str(value))


def _coerce(name: str, value: Any) -> Any:
    kinds = {f.name: f.type for f in fields(ServerConfig)}
    kind = str(kinds[name])
    if name == "store":  # checked on its own: its errors never show the value
        return _store_location(value)
    try:
        if name == "webhooks":
            return value if isinstance(value, tuple) else _webhook_tables(value, Path.cwd())
        if name in ("lease", "webhooks_retry_for"):
            return float(value) if isinstance(value, int | float) else parse_duration(str(value))
        if name == "history_max_age":
            return None if value in (None, "") else _seconds(value)
        if name == "events_retention":
            return _seconds(value)
        if name == "cors_origins":
            items = value if isinstance(value, list | tuple) else str(value).split(",")
            return tuple(str(v).strip() for v in items if str(v).strip())
        if name == "trusted_proxies":
            return _proxy_networks(value)
        if name == "comfyui":
            return value if isinstance(value, tuple) else _comfyui_tables(value, Path.cwd())
        if name == "backends":
            if isinstance(value, str):
                return tuple(v for v in value.split(",") if v.strip())
            return tuple(value)
        if name == "custom_nodes":
            items = value if isinstance(value, list | tuple) else str(value).split(os.pathsep)
            return tuple(Path(p) for p in items if str(p))
        if name == "data_dir":
            return Path(value)
        if name in ("secrets_file", "front_end_root", "webhooks_secret_file"):
            return None if value in (None, "") else Path(value)
        if name in ("testing_nodes", "webhooks_allow_private"):
            return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
        if "int" in kind:
            return None if value in (None, "") else int(value)
        if "float" in kind:
            return float(value)
        return str(value)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"bad value for {name}: {value!r} ({exc})") from None


def _proxy_networks(value: Any) -> tuple[ProxyNetwork, ...]:
    """Addresses and CIDR networks: a list, or text separated by commas."""
    items = value if isinstance(value, list | tuple) else [value]
    networks: list[ProxyNetwork] = []
    for item in items:
        if isinstance(item, ipaddress.IPv4Network | ipaddress.IPv6Network):
            networks.append(item)
            continue
        for text in str(item).split(","):
            if text.strip():
                try:  # strict: `10.0.0.5/8` is a typo, not the network 10.0.0.0/8
                    networks.append(ipaddress.ip_network(text.strip()))
                except ValueError as exc:
                    raise ConfigError(
                        f"trusted_proxies: {text.strip()!r} is not an IP address or network ({exc})"
                    ) from None
    return tuple(networks)


def _store_location(value: Any) -> str | None:
    """The `store` setting; its value stays out of errors (a URL may hold a password)."""
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise ConfigError("store must be a string (a postgresql:// URL or a file path)")
    try:
        check_store_location(value)
    except ValueError as exc:
        raise ConfigError(f"bad value for store: {exc}") from None
    return value


def load_config(
    config_file: Path | None = None,
    env: dict[str, str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> ServerConfig:
    """`overrides` are the flags: ServerConfig's fields, plus `auth_token` (a list of
    tokens) and `auth_token_file` (a path)."""
    known = {f.name for f in fields(ServerConfig)} - {
        "extra",
        "auth_tokens",
        "shares",
        "prices",
        "worker_tokens",
    }
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    tokens: list[AuthToken] = []
    workers: list[WorkerToken] = []
    tables: dict[str, Any] = {}
    if config_file is not None:
        try:
            data = tomllib.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc}") from None
        for key, value in data.items():
            name = key.replace("-", "_")
            if name == "auth":
                tokens += _auth_table(value, config_file.parent)
                continue
            if name == "worker_tokens":
                workers += _worker_tokens(value, config_file.parent)
                continue
            if name in ("tenants", "fair_share", "prices"):
                tables[name] = value
                continue
            if name == "comfyui":  # its paths are relative to the file
                value = _comfyui_tables(value, config_file.parent)
            if name == "webhooks":  # so are its secret files
                value = _webhook_tables(value, config_file.parent)
            (values if name in known else extra)[name] = value
    environ = os.environ if env is None else env
    for key, value in environ.items():
        if key.startswith("COMFYFLEET_"):
            name = key[len("COMFYFLEET_") :].lower()
            if name in known:
                values[name] = value
    flags = dict(overrides or {})
    _comfyui_flags(flags)
    tokens += _default_tokens(
        environ, flags.pop("auth_token", None), flags.pop("auth_token_file", None)
    )
    values.update({k: v for k, v in flags.items() if v is not None})
    config = replace(
        ServerConfig(),
        **{k: _coerce(k, v) for k, v in values.items()},
        auth_tokens=_checked_tokens(tokens),
        worker_tokens=_checked_worker_tokens(workers, tokens),
        shares=_share_policy(tables),
        prices=_prices(tables.get("prices")),
        extra=extra,
    )
    if config.local_slots < 0:
        raise ConfigError("local_slots must be >= 0")
    for name in ("max_prompt_nodes", "max_prompt_bytes", "events_max_prompt_bytes"):
        if getattr(config, name) < 1:
            raise ConfigError(f"{name} must be >= 1")
    if not 0 <= config.events_retention < float("inf"):
        raise ConfigError("events_retention must be a duration >= 0")
    if config.log_format not in ("text", "json"):
        raise ConfigError(f"log_format must be text or json, not {config.log_format!r}")
    if config.output_mode not in ("copy", "reference"):
        raise ConfigError(f"output_mode must be copy or reference, not {config.output_mode!r}")
    if not 0 < config.port < 65536:
        raise ConfigError(f"port out of range: {config.port}")
    if config.gateway_id is not None and not GATEWAY_ID.fullmatch(config.gateway_id):
        raise ConfigError(
            "gateway_id must be 1 to 64 letters, digits, '.', '_' or '-' (a letter or digit first)"
        )
    if not 1.0 <= config.lease <= 3600.0:
        raise ConfigError(f"lease must be between 1 s and 1 h, not {config.lease:g} s")
    if not 1.0 <= config.backend_hold <= MAX_HOLD:
        raise ConfigError(
            f"backend_hold must be between 1 s and 1 h, not {config.backend_hold:g} s"
        )
    config = _checked_webhooks(config)
    if config.auth_enabled and config.output_mode == "reference":
        raise ConfigError(
            "output_mode reference cannot keep tenants' outputs apart (files stay on shared "
            "backends): use copy with authentication"
        )
    return config


def _share_policy(tables: dict[str, Any]) -> SharePolicy:
    try:
        return parse_policy(tables.get("tenants"), tables.get("fair_share"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _prices(table: Any) -> PriceTable:
    try:
        return parse_prices(table)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


# -- managed backends ----------------------------------------------------------------


def _comfyui_tables(value: Any, base: Path) -> tuple[ManagedGroup, ...]:
    """`[[comfyui]]` tables; a plain string is a ComfyUI folder with every default."""
    from comfyfleet.managed.spec import parse_groups  # loads the fleet: only when used

    if isinstance(value, str | Path):
        value = [{"path": str(value)}]
    try:
        return parse_groups(value, base)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _comfyui_flags(flags: dict[str, Any]) -> None:
    """`--comfyui DIR` with `--comfyui-python`, `--gpus` and `--per-gpu` into one table
    (in place of the file's `[[comfyui]]` tables)."""
    given = {
        "python": flags.pop("comfyui_python", None),
        "gpus": flags.pop("gpus", None),
        "per_gpu": flags.pop("per_gpu", None),
    }
    table = {key: value for key, value in given.items() if value is not None}
    path = flags.get("comfyui")
    if path is None:
        if table:
            raise ConfigError("--comfyui-python, --gpus and --per-gpu go with --comfyui DIR")
        return
    flags["comfyui"] = _comfyui_tables([{"path": str(path), **table}], Path.cwd())


# -- webhooks -------------------------------------------------------------------------


def _webhook_tables(value: Any, base: Path) -> tuple[WebhookConfig, ...]:
    from comfyfleet.webhooks.settings import parse_tables

    try:
        return parse_tables(value, base)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _checked_webhooks(config: ServerConfig) -> ServerConfig:
    """The webhook settings checked; the secret file read into `webhooks_secret`."""
    from comfyfleet.webhooks.settings import read_secret_file
    from comfyfleet.webhooks.signing import parse_secret

    secret = config.webhooks_secret or None
    try:
        if config.webhooks_secret_file is not None:
            if secret is not None:
                raise ValueError("give webhooks_secret or webhooks_secret_file, not both")
            secret = read_secret_file(config.webhooks_secret_file)
        if secret is not None:
            parse_secret(secret)  # its errors never quote it
    except ValueError as exc:
        raise ConfigError(f"webhooks_secret: {exc}") from None
    if not config.webhooks_timeout > 0 or config.webhooks_concurrency < 1:
        raise ConfigError("webhooks_timeout must be > 0 and webhooks_concurrency >= 1")
    if config.webhooks_retry_for < 0:
        raise ConfigError("webhooks_retry_for must be >= 0")
    for name in ("public_url", "peer_url"):
        url = getattr(config, name)
        if url is not None and not re.match(r"^https?://[^/?#\s]+(/[^?#\s]*)?$", url):
            raise ConfigError(f"{name} must be an http(s) URL without query: {url!r}")
    return replace(config, webhooks_secret=secret)


# -- authentication ------------------------------------------------------------------


def _read_token_file(path: Path) -> str:
    """The token in a file: its first line, without surrounding blanks."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read token file {path}: {exc}") from None
    lines = text.strip().splitlines()
    return lines[0].strip() if lines else ""


def _default_tokens(
    env: Any, flag_tokens: list[str] | None, flag_file: Path | str | None
) -> list[AuthToken]:
    """The admin tokens of the `default` tenant: the flags', else the environment's."""
    tokens = list(flag_tokens or [])
    if flag_file:
        tokens.append(_read_token_file(Path(flag_file)))
    if not tokens:
        if env.get("COMFYFLEET_AUTH_TOKEN"):
            tokens.append(env["COMFYFLEET_AUTH_TOKEN"])
        if env.get("COMFYFLEET_AUTH_TOKEN_FILE"):
            tokens.append(_read_token_file(Path(env["COMFYFLEET_AUTH_TOKEN_FILE"])))
    return [AuthToken(token, DEFAULT_TENANT, admin=True) for token in tokens]


def _token_entries(
    entries: Any, base: Path, what: str, known: tuple[str, ...]
) -> Iterator[tuple[str, dict[str, Any], Path | None, str]]:
    """Each `[[what]]` entry checked: (where it is, the entry, its token file, its token)."""
    if not isinstance(entries, list):
        raise ConfigError(f"{what} must be a list of tables ([[{what}]])")
    for number, entry in enumerate(entries, 1):
        where = f"{what} entry {number}"
        if not isinstance(entry, dict) or set(entry) - set(known):
            raise ConfigError(f"{where}: only {', '.join(known)} are known")
        if ("token" in entry) == ("token_file" in entry):
            raise ConfigError(f"{where}: give token or token_file (one of them)")
        file = (base / str(entry["token_file"])).resolve() if "token_file" in entry else None
        token = _read_token_file(file) if file is not None else entry["token"]
        if not isinstance(token, str):
            raise ConfigError(f"{where}: token must be a string")
        yield where, entry, file, token


def _tenant_of(where: str, value: Any) -> str:
    try:
        return check_tenant_name(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _auth_table(table: Any, base: Path) -> list[AuthToken]:
    """`[auth]` with `[[auth.tokens]]` entries `{token | token_file, tenant, admin}`."""
    if not isinstance(table, dict) or set(table) - {"tokens"}:
        raise ConfigError("[auth] holds only [[auth.tokens]] entries")
    known = ("token", "token_file", "tenant", "admin")
    tokens = []
    for where, entry, _file, token in _token_entries(
        table.get("tokens", []), base, "auth.tokens", known
    ):
        admin = entry.get("admin", False)
        if not isinstance(admin, bool):
            raise ConfigError(f"{where}: admin must be true or false")
        tenant = _tenant_of(where, entry.get("tenant", DEFAULT_TENANT))
        tokens.append(AuthToken(token, tenant, admin))
    return tokens


def _worker_tokens(entries: Any, base: Path) -> list[WorkerToken]:
    """`[[worker_tokens]]` entries `{name, token | token_file, tenant}`."""
    known = ("name", "token", "token_file", "tenant")
    tokens = []
    for where, entry, file, token in _token_entries(entries, base, "worker_tokens", known):
        name = entry.get("name")
        if not isinstance(name, str):
            raise ConfigError(f"{where}: name must be a string")
        tenant = entry.get("tenant")
        tenant = None if tenant is None else _tenant_of(where, tenant)
        tokens.append(WorkerToken(name, token, file, tenant))
    return tokens


def _checked_worker_tokens(
    workers: list[WorkerToken], clients: list[AuthToken]
) -> tuple[WorkerToken, ...]:
    """Valid names and tokens, and never a client's token too (each kind admits one)."""
    if {w.token for w in workers} & {c.token for c in clients}:
        raise ConfigError("a worker token is also a client token: give each its own")
    try:
        return checked(workers)
    except WorkerTokenError as exc:
        raise ConfigError(str(exc)) from None


def _checked_tokens(tokens: list[AuthToken]) -> tuple[AuthToken, ...]:
    """Refuse empty tokens, tokens a header cannot carry, and one token for two tenants."""
    seen: dict[str, AuthToken] = {}
    for entry in tokens:
        if not entry.token:
            raise ConfigError(f"an empty auth token (tenant {entry.tenant})")
        if any(c.isspace() or ord(c) < 0x21 or ord(c) > 0x7E for c in entry.token):
            raise ConfigError(
                f"an auth token of tenant {entry.tenant} has blanks or non-ASCII characters"
            )
        earlier = seen.setdefault(entry.token, entry)
        if earlier is not entry and earlier.tenant != entry.tenant:
            raise ConfigError(
                f"one auth token is given to two tenants ({earlier.tenant}, {entry.tenant})"
            )
    return tuple(tokens)
