"""The processes under test: a private PostgreSQL cluster, `comfyfleet serve` gateways
on it, and their backends (plain comfyfleet servers on SQLite, and a real ComfyUI when
COMFYUI_DIR and COMFY_VENV are set). Each can be killed, paused and started again;
every process started and every signal sent is noted, for the checker."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import asyncpg

BIN = str(Path(sys.executable).parent / "comfyfleet")
PG_BIN = Path(os.environ.get("CHAOS_PG_BIN", "/usr/lib/postgresql/15/bin"))
#: The environment variable the testing pack's LedgerAppend appends to.
LEDGER_ENV = "COMFYFLEET_TEST_LEDGER"
CHAOS_NODES = Path(__file__).resolve().parent / "comfyui_nodes"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command may hold spaces and parentheses: the fields start after the last ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


@dataclass
class Signalled:
    """One signal the nemesis sent (or a start): to which process, when."""

    at: float  # time.time()
    target: str  # g1, b2, postgres
    pid: int
    action: str  # SIGKILL, SIGSTOP, SIGCONT, start, stop


@dataclass
class Journal:
    """Every start and signal of a schedule, in order."""

    entries: list[Signalled] = field(default_factory=list)

    def note(self, target: str, pid: int, action: str) -> None:
        self.entries.append(Signalled(time.time(), target, pid, action))


class Postgres:
    """A PostgreSQL cluster of its own on a free loopback port (never the machine's),
    with commit timestamps on (the checker orders the store's changes by them). As root,
    its programs run as the `postgres` user (PostgreSQL refuses root)."""

    def __init__(self, root: Path, journal: Journal) -> None:
        self.root = root
        self.data = root / "pgdata"
        self.port = free_port()
        self.journal = journal
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.frozen = False

    def server_url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *command: str) -> None:
        done = subprocess.run([*self.as_user, *command], capture_output=True, text=True, cwd="/")
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()}")

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.as_user:  # the postgres user needs to reach its folder
            self.root.parent.chmod(0o755)
            shutil.chown(self.root, "postgres")
        self._run(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
            "--no-sync",
        )  # fmt: skip

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c track_commit_timestamp=on -c max_connections=300 -c fsync=off"
        )
        log = str(self.root / "postgres.log")
        pg_ctl = str(PG_BIN / "pg_ctl")
        self._run(pg_ctl, "-D", str(self.data), "-l", log, "-o", options, "-w", "start")
        self.journal.note("postgres", self.pid() or 0, "start")

    def stop(self) -> None:
        """Immediate shutdown: what a crash leaves (WAL replay on the next start)."""
        self.journal.note("postgres", self.pid() or 0, "stop")
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def running(self) -> bool:
        pid = self.pid()
        return pid is not None and Path(f"/proc/{pid}").exists()

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def freeze(self) -> None:
        """SIGSTOP the postmaster, then every backend process it started."""
        pid = self.pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGSTOP)
        for child in children_of(pid):
            os.kill(child, signal.SIGSTOP)
        self.frozen = True
        self.journal.note("postgres", pid, "SIGSTOP")

    def thaw(self) -> None:
        pid = self.pid()
        if pid is None or not self.frozen:
            return
        self.frozen = False
        for child in children_of(pid):
            os.kill(child, signal.SIGCONT)
        os.kill(pid, signal.SIGCONT)
        self.journal.note("postgres", pid, "SIGCONT")

    async def create_database(self, name: str) -> str:
        conn = await asyncpg.connect(self.server_url())
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        return self.server_url(name)

    async def drop_database(self, name: str) -> None:
        conn = await asyncpg.connect(self.server_url())
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


class Server:
    """One `comfyfleet serve` (or ComfyUI) process, always on the same port and data
    dir, its ledger named by its environment, its output appended to `log`."""

    def __init__(
        self,
        name: str,
        command: list[str],
        port: int,
        folder: Path,
        journal: Journal,
        ready_path: str = "/prompt",
        ready_timeout: float = 60.0,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.command = command
        self.port = port
        self.folder = folder
        self.journal = journal
        self.ready_path = ready_path
        self.ready_timeout = ready_timeout
        self.cwd = cwd
        self.ledger = folder / "ledger.jsonl"
        self.log = folder / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, LEDGER_ENV: str(self.ledger)}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,  # the harness's Ctrl-C is not theirs
            )
        self.paused = False
        self.journal.note(self.name, self.proc.pid, "start")
        await self.wait_ready()

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited at start; see {self.log}")
                try:
                    timeout = aiohttp.ClientTimeout(total=2)
                    async with session.get(self.url + self.ready_path, timeout=timeout) as reply:
                        if reply.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.name} did not start in {self.ready_timeout} s; see {self.log}")

    def send(self, sig: signal.Signals) -> None:
        if not self.alive():
            return
        self.journal.note(self.name, self.pid, sig.name)
        os.kill(self.pid, sig)
        if sig == signal.SIGSTOP:
            self.paused = True
        elif sig == signal.SIGCONT:
            self.paused = False

    async def kill(self) -> None:
        if self.proc is None or not self.alive():
            return
        self.send(signal.SIGKILL)
        await asyncio.to_thread(self.proc.wait)
        self.paused = False

    async def stop(self) -> None:
        """At the end of a schedule (not a fault: nothing noted)."""
        if self.proc is not None and self.alive():
            os.kill(self.pid, signal.SIGKILL)
            await asyncio.to_thread(self.proc.wait)
        self.paused = False


@dataclass(frozen=True)
class Settings:
    gateways: int = 3
    backends: int = 2  # plain comfyfleet servers, each on its own SQLite store
    lease: float = 3.0
    hang_timeout: float = 4.0
    local_slots: int = 3  # each gateway's built-in engine
    backend_slots: int = 2
    max_attempts: int = 5
    comfyui_dir: Path | None = None  # with comfyui_python: one ComfyUI backend more
    comfyui_python: Path | None = None


class Cluster:
    """One schedule's processes: gateways g1..gN on a fresh database of the cluster's
    PostgreSQL, backends b1..bK (and `comfyui`), each gateway configured with all the
    backends and the webhook receiver."""

    def __init__(
        self, folder: Path, pg: Postgres, settings: Settings, journal: Journal, hook: str
    ) -> None:
        self.folder = folder
        self.pg = pg
        self.settings = settings
        self.journal = journal
        self.hook = hook  # the receiver's url
        self.store = ""  # the database's url, once made
        self.gateways: dict[str, Server] = {}
        self.backends: dict[str, Server] = {}

    def servers(self) -> dict[str, Server]:
        return {**self.gateways, **self.backends}

    def _backend(self, name: str) -> Server:
        s = self.settings
        folder = self.folder / name
        port = free_port()
        command = [
            BIN, "serve", "--port", str(port), "--data-dir", str(folder / "data"),
            "--testing-nodes", "--local-slots", str(s.backend_slots), "--log-level", "INFO",
        ]  # fmt: skip
        return Server(name, command, port, folder, self.journal)

    def _comfyui(self) -> Server:
        s = self.settings
        assert s.comfyui_dir is not None and s.comfyui_python is not None
        folder = self.folder / "comfyui"
        folder.mkdir(parents=True, exist_ok=True)
        paths = folder / "extra_model_paths.yaml"
        paths.write_text(f"chaos:\n    custom_nodes: {CHAOS_NODES}\n")
        port = free_port()
        command = [
            str(s.comfyui_python), str(s.comfyui_dir / "main.py"), "--listen", "127.0.0.1",
            "--port", str(port), "--cpu", "--output-directory", str(folder / "output"),
            "--temp-directory", str(folder / "temp"), "--extra-model-paths-config", str(paths),
        ]  # fmt: skip
        return Server(
            "comfyui",
            command,
            port,
            folder,
            self.journal,
            ready_path="/object_info/LedgerAppend",
            ready_timeout=180.0,
            cwd=s.comfyui_dir,
        )

    def _gateway(self, name: str, secret: str) -> Server:
        s = self.settings
        folder = self.folder / name
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "comfyfleet.toml"
        lines = [
            "webhooks_timeout = 2",
            "[[webhooks]]",
            'name = "chaos"',
            f'url = "{self.hook}"',
            f'secret = "{secret}"',
        ]
        for backend in self.backends.values():
            slots = 1 if backend.name == "comfyui" else s.backend_slots
            lines += ["[[backends]]", f'name = "{backend.name}"', f'url = "{backend.url}"']
            lines += [f"slots = {slots}"]
        config.write_text("\n".join(lines) + "\n")
        port = free_port()
        command = [
            BIN, "serve", "--config", str(config), "--port", str(port),
            "--data-dir", str(folder / "data"), "--store", self.store, "--gateway-id", name,
            "--testing-nodes", "--local-slots", str(s.local_slots), "--lease", f"{s.lease}s",
            "--hang-timeout", str(s.hang_timeout), "--max-attempts", str(s.max_attempts),
            "--log-level", "INFO",
        ]  # fmt: skip
        return Server(name, command, port, folder, self.journal)

    async def start(
        self, database: str, secret: str, install_audit: Callable[[str], Awaitable[None]]
    ) -> None:
        """Backends first (the gateways read what they can run), then the first gateway
        (it makes the tables), the audit, then the other gateways."""
        self.store = await self.pg.create_database(database)
        s = self.settings
        for n in range(1, s.backends + 1):
            self.backends[f"b{n}"] = self._backend(f"b{n}")
        if s.comfyui_dir is not None:
            self.backends["comfyui"] = self._comfyui()
        await asyncio.gather(*(b.start() for b in self.backends.values()))
        for n in range(1, s.gateways + 1):
            self.gateways[f"g{n}"] = self._gateway(f"g{n}", secret)
        first, *others = self.gateways.values()
        await first.start()
        await install_audit(self.store)
        await asyncio.gather(*(g.start() for g in others))

    async def heal(self) -> None:
        """Undo every fault: the store running and thawed, every process running."""
        self.pg.thaw()
        if not self.pg.running():
            await asyncio.to_thread(self.pg.start)
        for server in self.servers().values():
            if server.paused:
                server.send(signal.SIGCONT)
        await asyncio.gather(*(s.start() for s in self.servers().values() if not s.alive()))

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers().values()))


async def watch_machine(journal: Journal, stop: asyncio.Event, every: float = 0.1) -> None:
    """Note what no nemesis did but the processes suffer all the same: the wall clock
    stepped (against the monotonic one) by half a second or more, which moves every
    lease at once, and the machine stalled (this loop woke a second or more late)."""
    loop = asyncio.get_running_loop()
    offset = time.time() - time.monotonic()
    last = time.monotonic()
    while not stop.is_set():
        waiter = loop.create_task(stop.wait())
        await asyncio.wait([waiter], timeout=every)
        waiter.cancel()
        now = time.monotonic()
        step = time.time() - now - offset
        if abs(step) >= 0.5:
            journal.note("machine", 0, f"clock-step {step:+.1f}s")
            offset += step
        if now - last >= every + 1.0:
            journal.note("machine", 0, f"stall {now - last - every:.1f}s")
        last = now
