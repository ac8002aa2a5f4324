"""`comfyfleet worker` processes joining a gateway that has no lane of its own: they
connect out, the gateway dispatches to them through that connection, and every prompt
runs once (counted outside the processes, in a ledger file). The gateway never connects
to a worker, and a worker listens on no port but its backend's, on loopback."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from comfyfleet.testing import LEDGER_ENV
from comfyfleet.tunnel.ends import RETURN_WINDOW
from tests.integration.fleet.harness import poll
from tests.servers import ServerProcess

TOKEN = "pool-token-7c41f0d2a9e3b5"
CONFIG = f"""
[[worker_tokens]]
name = "pool"
token = "{TOKEN}"
"""


def ledger_prompt(tag: str, seconds: float = 0.0) -> dict[str, object]:
    return {
        "1": {"class_type": "LedgerAppend", "inputs": {"tag": tag, "seconds": seconds}},
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    }


class WorkerProcess:
    def __init__(
        self,
        gateway: str,
        folder: Path,
        name: str,
        *extra: str,
        token: str = TOKEN,
        backend: str | None = None,  # a backend's URL; by default one of its own
    ) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        brings = ("--backend", backend) if backend else ("--local-slots", "1", "--testing-nodes")
        command = [
            str(Path(sys.executable).parent / "comfyfleet"),
            "worker",
            *("--gateway", gateway, "--name", name, "--data-dir", str(folder / "data")),
            *brings,
            *extra,
        ]
        env = {**os.environ, "COMFYFLEET_WORKER_TOKEN": token}
        with (folder / "worker.log").open("ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    def log(self) -> str:
        return (self.folder / "worker.log").read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        # Its backend is its child: a SIGKILLed worker leaves it, as a preempted machine
        # would not; the test ends it.
        subprocess.run(["pkill", "-KILL", "-f", str(self.folder / "data")], check=False)


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServerProcess]:
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "ledger.jsonl"))
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    server = ServerProcess(tmp_path / "gateway", "--local-slots", "0", "--config", str(config))
    with server:
        yield server


def lanes_up(server: ServerProcess, count: int) -> bool:
    workers = server.get("/api/fleet/workers")["workers"]
    backends = {b["name"]: b["state"] for b in server.get("/api/fleet/backends")["backends"]}
    up = [w for w in workers if w["state"] == "connected" and backends.get(w["name"]) == "up"]
    return len(up) == count


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1


def sockets_of(pid: int) -> tuple[set[tuple[str, int]], set[int]]:
    """(the addresses and ports it listens on, the ports its outbound TCP connections
    go to), from /proc: its socket fds' inodes matched in /proc/net/tcp and tcp6."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    listening: set[tuple[str, int]] = set()
    established: list[tuple[int, int]] = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            (address, local), remote, state, inode = (
                fields[1].split(":"),
                fields[2],
                fields[3],
                fields[9],
            )
            if inode not in inodes:
                continue
            if state == "0A":
                listening.add((address, int(local, 16)))
            elif state == "01":
                established.append((int(local, 16), int(remote.split(":")[1], 16)))
    own = {port for _address, port in listening}
    outbound = {remote for local, remote in established if local not in own}
    return listening, outbound


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()]


def test_two_workers_run_two_hundred_prompts_each_once(
    gateway: ServerProcess, tmp_path: Path
) -> None:
    workers = [WorkerProcess(gateway.url, tmp_path / f"w{n}", f"w{n}") for n in range(2)]
    try:
        poll(lambda: lanes_up(gateway, 2), what="two workers", timeout=60)
        listed = gateway.get("/api/fleet/workers")["workers"]
        assert sorted(w["name"] for w in listed) == ["worker-pool.w0", "worker-pool.w1"]
        assert {w["address"] for w in listed} == {"127.0.0.1"}
        assert all(w["node_classes"] > 0 and time.time() - w["seen_at"] < 10 for w in listed)
        shown = gateway.get("/api/fleet/status")["lanes"]  # the dashboard's
        assert sorted(lane["backend"] for lane in shown if lane["kind"] == "worker") == [
            "worker-pool.w0",
            "worker-pool.w1",
        ]
        ids = [
            gateway.post("/prompt", {"prompt": ledger_prompt(f"p{n}")})["prompt_id"]
            for n in range(200)
        ]
        poll(
            lambda: (
                all(gateway.get(f"/history/{i}") for i in ids[-5:])
                and not gateway.get("/queue")["queue_pending"]
            ),
            what="the prompts",
            timeout=120,
        )
        for prompt_id in ids:
            entry = gateway.get(f"/history/{prompt_id}")[prompt_id]
            assert entry["status"]["status_str"] == "success", entry["status"]
        lines = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
        counted = [line["prompt_id"] for line in lines]
        assert sorted(counted) == sorted(ids)  # each once
        # Each announced its machine: its devices and memory, as its backend reports them.
        poll(
            lambda: all(w["machine"] for w in gateway.get("/api/fleet/workers")["workers"]),
            what="the workers' machines",
        )
        for listed in gateway.get("/api/fleet/workers")["workers"]:
            [device] = listed["machine"]["devices"]
            assert (device["name"], device["type"]) == ("cpu", "cpu")
            assert device["vram_total"] > 0 and listed["machine"]["ram_total"] > 0
            assert "argv" not in json.dumps(listed)  # its command line is its own
        backends = {children_of(worker.proc.pid)[0] for worker in workers}
        assert {line["pid"] for line in lines} == backends  # both worked, and only they
        # Only outbound connections, the workers': the gateway's own go to the loopback
        # ports it listens on (its ends of the tunnels), never to a worker.
        assert gateway.proc is not None
        gateway_ports, gateway_outbound = sockets_of(gateway.proc.pid)
        assert gateway_outbound <= {port for _address, port in gateway_ports}
        for worker in workers:
            listening, outbound = sockets_of(worker.proc.pid)
            assert listening == set()
            assert gateway.port in outbound
            [backend] = children_of(worker.proc.pid)
            backend_listens, _ = sockets_of(backend)
            assert backend_listens and {address for address, _ in backend_listens} <= LOOPBACK
    finally:
        for worker in workers:
            worker.kill()


def test_sigterm_drains_the_running_prompt_takes_nothing_new_and_exits_zero(
    gateway: ServerProcess, tmp_path: Path
) -> None:
    worker = WorkerProcess(gateway.url, tmp_path / "w0", "w0", "--grace", "30")
    try:
        poll(lambda: lanes_up(gateway, 1), what="the worker", timeout=60)
        running = gateway.post("/prompt", {"prompt": ledger_prompt("long", 2.0)})["prompt_id"]
        poll(lambda: gateway.get(f"/api/jobs/{running}")["status"] == "in_progress", what="a run")
        worker.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        poll(
            lambda: gateway.get("/api/fleet/workers")["workers"][0]["state"] == "draining",
            what="the drain",
        )
        # Queued (a worker may come), not given to the draining one.
        later = gateway.post("/prompt", {"prompt": ledger_prompt("later")})["prompt_id"]
        assert worker.proc.wait(timeout=31) == 0
        # Once its prompt (2 s) is recorded, not at the end of the grace.
        assert time.monotonic() - started < 10
        entry = gateway.get(f"/history/{running}")[running]
        assert entry["status"]["status_str"] == "success"
        assert gateway.get(f"/api/jobs/{later}")["status"] == "pending"  # nothing new taken
        lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
        assert [json.loads(line)["tag"] for line in lines] == ["long"]
        poll(lambda: gateway.get("/api/fleet/workers")["workers"] == [], what="its lane to go")
    finally:
        worker.kill()


@pytest.mark.parametrize("backend", ["its own", "--backend URL"])
def test_a_prompt_longer_than_the_grace_is_handed_back_and_the_worker_exits_in_time(
    gateway: ServerProcess, tmp_path: Path, backend: str
) -> None:
    """Past the grace the worker's backend stops what it runs (its own is killed, one it
    was given is interrupted), so the run handed back is the only one to finish."""
    with contextlib.ExitStack() as stack:
        url = None
        if backend == "--backend URL":
            given = ServerProcess(tmp_path / "given", "--local-slots", "1")
            url = stack.enter_context(given).url
        worker = WorkerProcess(gateway.url, tmp_path / "w0", "w0", "--grace", "2", backend=url)
        stack.callback(worker.kill)
        handed_back_once(gateway, worker, tmp_path)


def handed_back_once(gateway: ServerProcess, worker: WorkerProcess, tmp_path: Path) -> None:
    """An 8 s prompt, SIGTERM with a 2 s grace: out in time, the prompt queued again, and
    run to its end (its side effect) once, by the next worker."""
    poll(lambda: lanes_up(gateway, 1), what="the worker", timeout=60)
    long = gateway.post("/prompt", {"prompt": ledger_prompt("long", 8.0)})["prompt_id"]
    poll(lambda: gateway.get(f"/api/jobs/{long}")["status"] == "in_progress", what="a run")
    worker.proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert worker.proc.wait(timeout=10) == 0
    assert time.monotonic() - started < 2 + 1
    poll(lambda: gateway.get(f"/api/jobs/{long}")["status"] == "pending", what="its return")
    successor = WorkerProcess(gateway.url, tmp_path / "w1", "w1")
    try:
        poll(lambda: bool(gateway.get(f"/history/{long}")), what="the rerun", timeout=90)
        assert gateway.get(f"/history/{long}")[long]["status"]["status_str"] == "success"
    finally:
        successor.kill()
    # The cut-short run never reached its side effect: one line, the rerun's.
    lines = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [line["tag"] for line in lines] == ["long"]


@pytest.mark.parametrize("survivor_first", [False, True], ids=["joins-after", "up-already"])
def test_a_worker_killed_mid_prompt_loses_nothing_and_runs_nothing_twice(
    gateway: ServerProcess, tmp_path: Path, survivor_first: bool
) -> None:
    doomed = WorkerProcess(gateway.url, tmp_path / "w0", "w0")
    survivor = None
    try:
        poll(lambda: lanes_up(gateway, 1), what="the first worker", timeout=60)
        # Long enough to outlast the second worker's start on a slow machine.
        seconds = 10.0 if survivor_first else 1.5
        prompt = ledger_prompt("once", seconds)
        prompt_id = gateway.post("/prompt", {"prompt": prompt})["prompt_id"]
        poll(lambda: gateway.get(f"/api/jobs/{prompt_id}")["status"] == "in_progress", what="a run")
        if survivor_first:
            survivor = WorkerProcess(gateway.url, tmp_path / "w1", "w1")
            poll(lambda: lanes_up(gateway, 2), what="the second worker", timeout=60)
            assert gateway.get(f"/api/jobs/{prompt_id}")["status"] == "in_progress"
        doomed.kill()  # the worker and its backend, at once
        killed_at = time.time()
        if survivor is None:
            survivor = WorkerProcess(gateway.url, tmp_path / "w1", "w1")
        poll(
            lambda: bool(gateway.get(f"/history/{prompt_id}")),
            what="the prompt to end on the other worker",
            timeout=90,
        )
        entry = gateway.get(f"/history/{prompt_id}")[prompt_id]
        assert entry["status"]["status_str"] == "success"
        lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
        assert [json.loads(line)["tag"] for line in lines] == ["once"]
        if survivor_first:
            # Its connection broke (no close frame): it is dead, or lets go unless back
            # within RETURN_WINDOW; the prompt does not wait out the 30 s hold.
            rerun = gateway.get(f"/api/jobs/{prompt_id}")
            took = rerun["execution_start_time"] / 1000 - killed_at
            assert RETURN_WINDOW <= took < RETURN_WINDOW + 5, f"rerun {took:.2f} s after"
    finally:
        doomed.kill()
        if survivor is not None:
            survivor.kill()


@pytest.mark.parametrize("seconds", [6.0, 1.0], ids=["running-on", "ended-meanwhile"])
def test_a_gateway_killed_and_started_again_finds_its_workers_prompt(
    gateway: ServerProcess, tmp_path: Path, seconds: float
) -> None:
    """Its worker's connection broke, but every attempt to reconnect was refused (the
    gateway's process was down): it does not let go, and the prompt runs once, on. The
    gateway started again follows it on the worker's lane when that joins (after its
    recovery): still running there, or ended there meanwhile (read from its history)."""
    worker = WorkerProcess(gateway.url, tmp_path / "w0", "w0")
    try:
        poll(lambda: lanes_up(gateway, 1), what="the worker", timeout=60)
        prompt = ledger_prompt("once", seconds)
        prompt_id = gateway.post("/prompt", {"prompt": prompt})["prompt_id"]
        poll(lambda: gateway.get(f"/api/jobs/{prompt_id}")["status"] == "in_progress", what="a run")
        gateway.kill()
        time.sleep(2 * RETURN_WINDOW)
        gateway.start()
        poll(lambda: bool(gateway.get(f"/history/{prompt_id}")), what="its end", timeout=90)
        entry = gateway.get(f"/history/{prompt_id}")[prompt_id]
        assert entry["status"]["status_str"] == "success"
        lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
        assert [json.loads(line)["tag"] for line in lines] == ["once"]
        assert gateway.get(f"/api/jobs/{prompt_id}")["attempt"] == 1
        assert "lets go" not in worker.log()
    finally:
        worker.kill()


ALICE, BOB = "alice-client-token-31f5", "bob-client-token-8e0c"
TENANT_CONFIG = f"""
[[auth.tokens]]
token = "{ALICE}"
tenant = "alice"
admin = true

[[auth.tokens]]
token = "{BOB}"
tenant = "bob"

[[worker_tokens]]
name = "alices-gpu"
token = "{TOKEN}"
tenant = "alice"

[[worker_tokens]]
name = "shared"
token = "{TOKEN[::-1]}"
"""


def test_a_worker_brought_for_one_tenant_runs_only_that_tenants_prompts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "ledger.jsonl"))
    config = tmp_path / "gateway.toml"
    config.write_text(TENANT_CONFIG)
    args = ("--local-slots", "0", "--config", str(config))
    with ServerProcess(tmp_path / "gateway", *args, token=ALICE) as gateway:
        alices = WorkerProcess(gateway.url, tmp_path / "w0", "")
        shared = None
        try:
            poll(lambda: lanes_up(gateway, 1), what="alice's worker", timeout=60)
            [listed] = gateway.get("/api/fleet/workers")["workers"]
            assert (listed["name"], listed["tenant"]) == ("worker-alices-gpu", "alice")
            gateway.token = BOB
            bobs = gateway.post("/prompt", {"prompt": ledger_prompt("bob")})["prompt_id"]
            gateway.token = ALICE
            hers = gateway.post("/prompt", {"prompt": ledger_prompt("alice")})["prompt_id"]
            poll(lambda: bool(gateway.get(f"/history/{hers}")), what="alice's prompt")
            time.sleep(1.0)
            gateway.token = BOB
            assert gateway.get(f"/api/jobs/{bobs}")["status"] == "pending"  # not on hers
            shared = WorkerProcess(gateway.url, tmp_path / "w1", "", token=TOKEN[::-1])
            poll(lambda: bool(gateway.get(f"/history/{bobs}")), what="bob's prompt", timeout=60)
            lines = [json.loads(x) for x in (tmp_path / "ledger.jsonl").read_text().splitlines()]
            pids = {line["tag"]: line["pid"] for line in lines}
            assert pids["alice"] == children_of(alices.proc.pid)[0]
            assert pids["bob"] == children_of(shared.proc.pid)[0]
        finally:
            alices.kill()
            if shared is not None:
                shared.kill()


def sleep_prompt(seconds: float, tag: str) -> dict[str, object]:
    return {
        "1": {"class_type": "LedgerAppend", "inputs": {"tag": tag, "seconds": seconds}},
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    }


def test_demand_says_how_many_workers_the_queue_wants(
    gateway: ServerProcess, tmp_path: Path
) -> None:
    assert gateway.get("/api/fleet/demand")["workers_wanted"] is None  # nothing ran yet
    worker = WorkerProcess(gateway.url, tmp_path / "w0", "w0", "--grace", "10")
    try:
        poll(lambda: lanes_up(gateway, 1), what="the worker", timeout=60)
        ran = [gateway.post("/prompt", {"prompt": sleep_prompt(0.5, f"r{n}")}) for n in range(3)]
        poll(
            lambda: all(gateway.get(f"/history/{r['prompt_id']}") for r in ran),
            what="three prompts",
            timeout=60,
        )
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(timeout=15) == 0
        poll(lambda: gateway.get("/api/fleet/workers")["workers"] == [], what="its lane to go")
        for n in range(20):
            gateway.post("/prompt", {"prompt": sleep_prompt(0.5, f"q{n}")})
        demand = gateway.get("/api/fleet/demand?target_wait=2")
        assert (demand["pending"], demand["running"]) == (20, 0)
        assert 0.5 <= demand["seconds_per_prompt"] < 1.5
        per_prompt = demand["seconds_per_prompt"]
        assert demand["slots_wanted"] == math.ceil(20 * per_prompt / 2)
        assert demand["workers_wanted"] == demand["slots_wanted"]  # no lane left: 1 slot each
        assert demand["workers"] == {"connected": 0, "idle": 0, "draining": 0}
        assert demand["needs"] == [{"classes": [], "pending": 20}]  # the gateway's own nodes
        metrics = urllib.request.urlopen(gateway.url + "/metrics", timeout=10).read().decode()
        assert f"comfyfleet_workers_wanted {float(math.ceil(20 * per_prompt / 60))}" in metrics
        assert 'comfyfleet_workers{state="connected"} 0.0' in metrics
        for bad in ("0", "nan", "x", "100000"):
            try:
                gateway.get(f"/api/fleet/demand?target_wait={bad}")
            except urllib.error.HTTPError as exc:
                assert exc.code == 400
            else:
                raise AssertionError(f"target_wait={bad} was taken")
    finally:
        worker.kill()


def test_megabytes_go_both_ways_through_a_workers_connection(
    gateway: ServerProcess, tmp_path: Path
) -> None:
    """An upload the gateway pushes to the worker's backend and the output it fetches
    back, each many full messages of the tunnel (noise does not compress)."""
    noise = Image.frombytes("RGB", (600, 600), os.urandom(600 * 600 * 3))
    png = io.BytesIO()
    noise.save(png, "PNG")
    assert len(png.getvalue()) > 1_000_000
    boundary = "worker-boundary-51f2"
    body = (
        (
            f"--{boundary}\r\nContent-Disposition: form-data; "
            'name="image"; filename="noise.png"\r\nContent-Type: image/png\r\n\r\n'
        ).encode()
        + png.getvalue()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    request = urllib.request.Request(
        gateway.url + "/upload/image",
        data=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        name = json.loads(answer.read())["name"]
    worker = WorkerProcess(gateway.url, tmp_path / "w0", "w0")
    try:
        poll(lambda: lanes_up(gateway, 1), what="the worker", timeout=60)
        prompt = {
            "1": {"class_type": "LoadImage", "inputs": {"image": name}},
            "2": {
                "class_type": "SaveImage",
                "inputs": {"images": ["1", 0], "filename_prefix": "n"},
            },
        }
        prompt_id = gateway.post("/prompt", {"prompt": prompt})["prompt_id"]
        poll(lambda: bool(gateway.get(f"/history/{prompt_id}")), what="the prompt", timeout=60)
        entry = gateway.get(f"/history/{prompt_id}")[prompt_id]
        assert entry["status"]["status_str"] == "success", entry["status"]
        [saved] = entry["outputs"]["2"]["images"]
        view = f"{gateway.url}/view?filename={saved['filename']}&type=output"
        with urllib.request.urlopen(view, timeout=30) as answer:
            back = Image.open(io.BytesIO(answer.read())).convert("RGB")
        assert back.tobytes() == noise.tobytes()
    finally:
        worker.kill()
