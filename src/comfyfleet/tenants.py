"""Tenants: who owns a job and its files once authentication is on.

Every job belongs to a tenant. Without authentication there is one, `default`, and
everything behaves as if tenants did not exist. The `default` tenant keeps its files in
the data dir's own `input/`, `output/` and `temp/` folders (so turning authentication on
for a server that ran without it keeps its files where they were); every other tenant
gets `tenants/<name>/{input,output,temp}` under the data dir. A tenant's user data (the
editor's settings and saved workflows) is in `user/` beside its other folders.
"""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

from comfyfleet.folders import Folders

DEFAULT_TENANT = "default"
#: Tenant names: safe as a path component and in logs.
TENANT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_tenant_name(name: object) -> str:
    """`name` if it is a valid tenant name; ValueError otherwise."""
    if not isinstance(name, str) or not TENANT_NAME.fullmatch(name):
        raise ValueError(f"bad tenant name {name!r}: letters, digits, _ and - (1 to 64)")
    return name


class TenantFolders:
    """The folders of each tenant: `default` gets `base`, the others `root/<name>/...`."""

    def __init__(self, base: Folders, root: Path) -> None:
        self.default = base
        self.root = root.resolve()
        self._known: dict[str, Folders] = {DEFAULT_TENANT: base}
        self._lock = threading.Lock()  # `of` is also called from worker threads
        self._ready: set[str] = set()

    def of(self, tenant: str) -> Folders:
        """The tenant's folders (not created here: whatever writes a file creates them)."""
        folders = self._known.get(tenant)
        if folders is None:
            folders = Folders.under(self.root / check_tenant_name(tenant))
            with self._lock:
                folders = self._known.setdefault(tenant, folders)
        return folders

    def user_dir(self, tenant: str) -> Path:
        """Where the tenant's user data lives: `user/` beside its input and output
        folders (the data dir's own for `default`). Not created here."""
        return self.of(tenant).output.parent / "user"

    async def ready(self, tenant: str) -> Folders:
        """The tenant's folders, created (in a worker thread) the first time they are asked
        for here: before a prompt of theirs runs."""
        folders = self.of(tenant)
        if tenant not in self._ready:
            await asyncio.to_thread(folders.ensure)
            self._ready.add(tenant)
        return folders
