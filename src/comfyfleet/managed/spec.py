"""Managed backends as configured: a `[[comfyui]]` table, and the instances it runs.

One table (or `--comfyui DIR`) names a ComfyUI folder (or any command that serves
ComfyUI's API) and the GPUs to run it on; it becomes `per_gpu` instances per GPU, each
a backend of the fleet on its own loopback port, with its folders and log under the
gateway's data dir (`managed/<name>/`).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from string import Formatter
from typing import Any

from comfyfleet.domain.backend_names import NAME, FleetError
from comfyfleet.folders import UnsafePath, resolve_inside

#: Ports tried for instances unless a table says otherwise (ComfyUI's 8188 is left alone).
DEFAULT_PORTS = (8200, 8299)
MAX_PER_GPU = 64
#: A command template that runs comfyfleet itself as a one-at-a-time ComfyUI stand-in
#: (its testing nodes loaded): what the tests and benchmarks manage.
COMFYFLEET_COMMAND = (
    "{python}",
    "-m",
    "comfyfleet",
    "serve",
    "--port",
    "{port}",
    "--data-dir",
    "{dir}",
    "--local-slots",
    "1",
    "--testing-nodes",
    "--log-level",
    "WARNING",
)
MAX_WARMUP_BYTES = 10 * 1024 * 1024
#: What a command template may name.
PLACEHOLDERS = frozenset(
    {"python", "path", "port", "dir", "input", "output", "temp", "gpu", "name", "pack_paths"}
)
KEYS = frozenset(
    {
        "name",
        "path",
        "python",
        "command",
        "gpus",
        "per_gpu",
        "args",
        "env",
        "port_range",
        "max_prompts",
        "max_rss",
        "warmup",
        "tags",
        "slots",
        "prefetch",
        "start_timeout",
        "health_timeout",
    }
)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_GPU = re.compile(r"^\d{1,4}$")


@dataclass(frozen=True)
class ManagedGroup:
    """One `[[comfyui]]` table, checked."""

    name: str = "comfyui"  # instances are <name>-gpu<N>-<k> or <name>-cpu-<k>
    path: Path | None = None  # the ComfyUI folder; the command runs there
    python: str = sys.executable
    command: tuple[str, ...] = ()  # a template; empty: ComfyUI's main.py (`comfyui_argv`)
    gpus: tuple[str, ...] | None = None  # GPU ids, or ("cpu",); None: every GPU found
    per_gpu: int = 1
    args: tuple[str, ...] = ()  # appended to the command (a template too)
    env: tuple[tuple[str, str], ...] = ()
    port_range: tuple[int, int] = DEFAULT_PORTS
    max_prompts: int | None = None  # recycled (when idle) after this many prompts
    max_rss: int | None = None  # bytes: recycled (when idle) once grown past it
    warmup: Mapping[str, Any] | None = field(default=None, compare=False)  # a prompt
    tags: tuple[str, ...] = ()
    slots: int = 1
    prefetch: int = 0
    start_timeout: float = 600.0  # seconds for a new process to answer
    health_timeout: float = 60.0  # seconds without an answer before it is restarted

    @property
    def runs_comfyui(self) -> bool:
        """Whether it starts ComfyUI's own main.py (not a command of its own)."""
        return not self.command


@dataclass(frozen=True)
class InstanceSpec:
    """One managed process: a backend named `name` on 127.0.0.1:`port`."""

    group: ManagedGroup
    name: str
    gpu: str  # a GPU id, or "cpu"
    port: int
    folder: Path  # input/, output/, temp/ and process.log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.folder / "process.log"

    def backend(self) -> dict[str, Any]:
        """Its backend definition, as `[[backends]]` tables give them."""
        group = self.group
        tags = [*group.tags, "managed", self.gpu if self.gpu == "cpu" else f"gpu{self.gpu}"]
        return {
            "url": self.url,
            "name": self.name,
            "slots": group.slots,
            "prefetch": group.prefetch,
            "tags": tags,
        }

    def argv(self, pack_paths: Path | None) -> list[str]:
        """The command line: the group's template with this instance's values, then `args`."""
        group = self.group
        values = {
            "python": group.python,
            "path": str(group.path or self.folder),
            "port": str(self.port),
            "dir": str(self.folder),
            "input": str(self.folder / "input"),
            "output": str(self.folder / "output"),
            "temp": str(self.folder / "temp"),
            "gpu": self.gpu,
            "name": self.name,
            "pack_paths": str(pack_paths or ""),
        }
        template = [*(group.command or comfyui_argv(self.gpu, pack_paths)), *group.args]
        return [part.format_map(values) for part in template]

    def environment(self, inherited: Mapping[str, str]) -> dict[str, str]:
        """The gateway's environment without its own settings (COMFYFLEET_*, its tokens
        among them), the table's `env`, and the GPU it may see."""
        env = {k: v for k, v in inherited.items() if not k.startswith("COMFYFLEET_")}
        env["PYTHONUNBUFFERED"] = "1"  # its log is written as it goes
        if self.gpu != "cpu":
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
        env.update(self.group.env)
        return env

    @property
    def cwd(self) -> Path:
        return self.group.path or self.folder


def comfyui_argv(gpu: str, pack_paths: Path | None) -> list[str]:
    """ComfyUI's main.py on loopback, with its folders under the instance's own."""
    argv = ["{python}", "main.py", "--listen", "127.0.0.1", "--port", "{port}"]
    argv += ["--output-directory", "{output}", "--temp-directory", "{temp}"]
    argv += ["--input-directory", "{input}"]
    if pack_paths is not None:  # the companion pack, from an extra custom-nodes folder
        argv += ["--extra-model-paths-config", "{pack_paths}"]
    if gpu == "cpu":
        argv.append("--cpu")
    return argv


# -- parsing --------------------------------------------------------------------------


def parse_groups(raw: Any, base: Path) -> tuple[ManagedGroup, ...]:
    """`[[comfyui]]` tables (relative paths are relative to `base`), checked."""
    tables = [raw] if isinstance(raw, dict) else raw
    if not isinstance(tables, list | tuple):
        raise FleetError("comfyui must be a list of tables ([[comfyui]])")
    groups = tuple(parse_group(table, base) for table in tables)
    names = [group.name for group in groups]
    for name in set(names):
        if names.count(name) > 1:
            raise FleetError(f"two [[comfyui]] tables are named {name!r}: give each a name")
    return groups


def parse_group(table: Any, base: Path) -> ManagedGroup:
    if not isinstance(table, dict):
        raise FleetError("a [[comfyui]] entry must be a table")
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise FleetError(f"[[comfyui]]: unknown keys {unknown} (known: {sorted(KEYS)})")
    name = table.get("name", "comfyui")
    if not isinstance(name, str) or not NAME.fullmatch(name) or len(name) > 40:
        raise FleetError(f"[[comfyui]] name {name!r}: letters, digits, . _ - (max 40)")
    where = f"[[comfyui]] {name}"
    path = _path(table.get("path"), base, where)
    command = _strings(table.get("command", []), f"{where}: command")
    if not command:
        if path is None:
            raise FleetError(f"{where}: give path (the ComfyUI folder) or a command")
        if not (path / "main.py").is_file():
            raise FleetError(f"{where}: {path} is not a ComfyUI folder (no main.py)")
    args = _strings(table.get("args", []), f"{where}: args")
    _check_template(command + args, where)
    return ManagedGroup(
        name=name,
        path=path,
        python=comfyui_python(table.get("python"), path, base, where),
        command=command,
        gpus=parse_gpus(table.get("gpus", "all"), where),
        per_gpu=_count(table.get("per_gpu", 1), f"{where}: per_gpu", 1, MAX_PER_GPU),
        args=args,
        env=_env(table.get("env", {}), where),
        port_range=_port_range(table.get("port_range", DEFAULT_PORTS), where),
        max_prompts=_optional_count(table.get("max_prompts"), f"{where}: max_prompts"),
        max_rss=_optional_size(table.get("max_rss"), where),
        warmup=_warmup(table.get("warmup"), base, where),
        tags=_strings(table.get("tags", []), f"{where}: tags"),
        slots=_count(table.get("slots", 1), f"{where}: slots", 1, 1024),
        prefetch=_count(table.get("prefetch", 0), f"{where}: prefetch", 0, 1024),
        start_timeout=_seconds(table.get("start_timeout", 600.0), f"{where}: start_timeout"),
        health_timeout=_seconds(table.get("health_timeout", 60.0), f"{where}: health_timeout"),
    )


def parse_gpus(value: Any, where: str = "comfyui") -> tuple[str, ...] | None:
    """`all` (None: every GPU found), `cpu`, or GPU ids: `0,1`, `[0, 1]`."""
    if isinstance(value, str) and value.strip().lower() in ("all", "cpu"):
        return None if value.strip().lower() == "all" else ("cpu",)
    items = value.split(",") if isinstance(value, str) else value
    if isinstance(items, int) and not isinstance(items, bool):
        items = [items]
    if not isinstance(items, list | tuple):
        raise FleetError(f"{where}: gpus must be all, cpu or GPU numbers (0,1)")
    ids = [str(item).strip() for item in items if not isinstance(item, bool)]
    if not ids or len(ids) != len(items) or not all(_GPU.fullmatch(i) for i in ids):
        raise FleetError(f"{where}: gpus must be all, cpu or GPU numbers (0,1), not {value!r}")
    return tuple(dict.fromkeys(ids))


def parse_size(value: Any) -> int:
    """Bytes from `12G`, `800M`, `1.5GiB`, `4096` (K, M, G, T are powers of 1024)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"not a size: {value!r} (use e.g. 800M, 12G)")
    power = " kmgt".index(match.group(2).lower() or " ")
    return int(float(match.group(1)) * 1024**power)


def _path(value: Any, base: Path, where: str) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\x00" in value:
        raise FleetError(f"{where}: path must be a folder")
    path = (base / Path(value).expanduser()).resolve()
    if not path.is_dir():
        raise FleetError(f"{where}: {path} is not a folder")
    return path


def comfyui_python(value: Any, path: Path | None, base: Path, where: str) -> str:
    """The given interpreter; else the ComfyUI folder's venv; else this one."""
    if value is not None:
        if not isinstance(value, str) or not value or "\x00" in value:
            raise FleetError(f"{where}: python must be a path or a command name")
        if os.sep not in value:
            return value  # a command name, looked up on PATH
        # Not resolved: a venv's python is a link, and run through its target the venv
        # (found next to the path it was started as) is not used.
        return os.path.abspath(base / Path(value).expanduser())
    for venv in ("venv", ".venv"):
        for found in (Path(venv, "bin", "python"), Path(venv, "Scripts", "python.exe")):
            if path is not None and (path / found).is_file():
                return str(path / found)
    return sys.executable


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise FleetError(f"{where} must be a list of strings")
    if any("\x00" in v for v in value):
        raise FleetError(f"{where}: a string holds a NUL byte")
    return tuple(value)


def _check_template(command: tuple[str, ...], where: str) -> None:
    for part in command:
        try:
            names = {field for _, field, _, _ in Formatter().parse(part) if field is not None}
        except ValueError as exc:
            raise FleetError(f"{where}: {part!r}: {exc} (write {{{{ for {{)") from None
        unknown = names - PLACEHOLDERS
        if unknown:
            raise FleetError(
                f"{where}: {part!r} names {sorted(unknown)}; known: {sorted(PLACEHOLDERS)}"
            )


def _env(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise FleetError(f"{where}: env must be a table of strings")
    if any(not k or "=" in k or "\x00" in k + v for k, v in value.items()):
        raise FleetError(f"{where}: env holds a bad variable name or a NUL byte")
    return tuple(sorted(value.items()))


def _port_range(value: Any, where: str) -> tuple[int, int]:
    if isinstance(value, str):
        value = value.split("-")
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise FleetError(f"{where}: port_range must be [first, last] (or 'first-last')")
    try:
        first, last = (int(v) for v in value)
    except (TypeError, ValueError):
        raise FleetError(f"{where}: port_range must be two port numbers") from None
    if not 1 <= first <= last <= 65535:
        raise FleetError(f"{where}: port_range {first}-{last} is not a range of ports")
    return first, last


def _count(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise FleetError(f"{where} must be an integer {low}..{high}")
    return value


def _optional_count(value: Any, where: str) -> int | None:
    return None if value is None else _count(value, where, 1, 2**31)


def _optional_size(value: Any, where: str) -> int | None:
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise FleetError(f"{where}: max_rss: {exc}") from None


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e7:
        raise FleetError(f"{where} must be a number of seconds")
    return float(value)


def _warmup(value: Any, base: Path, where: str) -> dict[str, Any] | None:
    """The warm-up prompt: an API-format workflow file (bare or as `{"prompt": ...}`)."""
    if value is None:
        return None
    path = _path_of_file(value, base, where)
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_WARMUP_BYTES + 1)
        if len(raw) > MAX_WARMUP_BYTES:
            raise FleetError(f"{where}: warmup {path} is larger than 10 MB")
        data = json.loads(raw)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FleetError(f"{where}: cannot read warmup {path}: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("prompt"), dict):
        data = data["prompt"]
    if not isinstance(data, dict) or not data:
        raise FleetError(f"{where}: warmup {path} holds no API-format prompt")
    return data


def _path_of_file(value: Any, base: Path, where: str) -> Path:
    if not isinstance(value, str) or not value or "\x00" in value:
        raise FleetError(f"{where}: warmup must be a file name")
    return (base / Path(value).expanduser()).resolve()


# -- planning ------------------------------------------------------------------------


def visible_gpus(env: Mapping[str, str]) -> list[str]:
    """The GPUs this machine offers: those `CUDA_VISIBLE_DEVICES` names, else every NVIDIA
    GPU the driver lists."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if _GPU.fullmatch(g.strip())]
    try:
        count = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return []
    return [str(i) for i in range(count)]


def plan(
    groups: Iterable[ManagedGroup],
    root: Path,
    *,
    gpus_found: list[str],
    avoid: set[int],
    free: Any = None,
) -> list[InstanceSpec]:
    """Every instance of `groups`, each with a free port of its group's range (none of
    `avoid`) and its folder under `root`."""
    is_free = free or port_is_free
    taken = set(avoid)
    planned = []
    for group in groups:
        gpus = group.gpus if group.gpus is not None else tuple(gpus_found) or ("cpu",)
        for gpu in gpus:
            label = "cpu" if gpu == "cpu" else f"gpu{gpu}"
            for k in range(group.per_gpu):
                name = f"{group.name}-{label}-{k}"
                port = _next_port(group, taken, is_free)
                taken.add(port)
                planned.append(InstanceSpec(group, name, gpu, port, _folder(root, name)))
    return planned


def _next_port(group: ManagedGroup, taken: set[int], is_free: Any) -> int:
    first, last = group.port_range
    for port in range(first, last + 1):
        if port not in taken and is_free(port):
            return port
    raise FleetError(f"[[comfyui]] {group.name}: no free port left in {first}-{last}")


def _folder(root: Path, name: str) -> Path:
    try:
        return resolve_inside(root, name)
    except UnsafePath as exc:  # a name is one plain component; a link there may lead out
        raise FleetError(f"managed instance {name}: {exc}") from None


def port_is_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:`port` (as servers do, with
    SO_REUSEADDR: connections closed a moment ago do not hold it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
