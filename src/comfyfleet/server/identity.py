"""Which gateway this process is, among those sharing one store.

The id is `gateway_id` from the config, or else the one kept in the data dir (made on
first start), so a restarted gateway is the same gateway: it recovers its own jobs at
once instead of waiting for its old lease to run out.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from pathlib import Path

from comfyfleet.domain.gateways import GATEWAY_ID, GatewayRecord

log = logging.getLogger(__name__)

ID_FILE = "gateway-id"


def this_gateway(
    gateway_id: str | None, data_dir: Path, host: str, port: int, peer_url: str | None = None
) -> GatewayRecord:
    """This process as the store knows it (the store fills in the instance), with the URL
    its peers reach it at."""
    chosen = gateway_id or kept_id(data_dir)
    url = peer_url or default_peer_url(host, port)
    return GatewayRecord(chosen, "", socket.gethostname(), os.getpid(), url, time.time())


def default_peer_url(host: str, port: int) -> str:
    """http://host:port; a wildcard host (every address) is reached by the machine's name."""
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def kept_id(data_dir: Path) -> str:
    """The id in `data_dir/gateway-id`, made when missing. A file that is not a plain
    file, or holds anything but an id, is left alone: this run gets a fresh id."""
    path = data_dir / ID_FILE
    try:
        if path.is_file() and not path.is_symlink():
            with path.open("rb") as kept:
                text = kept.read(100).decode("ascii", "replace").strip()
            if GATEWAY_ID.fullmatch(text):
                return text
            log.warning("%s does not hold a gateway id: this run uses a fresh one", path)
            return _fresh()
    except OSError as exc:
        log.warning("cannot read %s (%s): this run uses a fresh gateway id", path, exc)
        return _fresh()
    fresh = _fresh()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(path, flags, 0o644)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(fresh + "\n")
    except FileExistsError:
        return kept_id(data_dir) if path.is_file() and not path.is_symlink() else fresh
    except OSError as exc:
        log.warning("cannot keep the gateway id in %s (%s)", path, exc)
    return fresh


def _fresh() -> str:
    return f"gw-{secrets.token_hex(6)}"


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host (it may be another program)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
