"""A gateway process in front of real backend processes (comfyfleet in one-slot mode).

Blocking helpers (urllib) for the admin API, the jobs API and the backends' own
ComfyUI routes; every wait polls a server-side condition with a deadline.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.integration.gateway.wire import sleep_prompt
from tests.servers import ServerProcess

__all__ = ["sleep_prompt"]  # the prompt builder the fleet tests import from here

TIMEOUT = 30.0


def poll(check: Callable[[], bool], *, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def call(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """(HTTP status, JSON body or None): error statuses are answers too."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw) if raw.strip() else None
    except json.JSONDecodeError:
        return status, raw.decode("utf-8", "replace")


def unique_history(server: ServerProcess) -> dict[str, Any]:
    """GET /history, failing on a repeated key (json.loads alone would keep the last)."""
    repeated: list[str] = []

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        repeated.extend(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        return dict(pairs)

    with urllib.request.urlopen(f"{server.url}/history", timeout=15) as response:
        history: dict[str, Any] = json.loads(response.read(), object_pairs_hook=unique)
    assert repeated == [], f"repeated history entries: {repeated}"
    return history


def start_all(servers: Iterable[ServerProcess]) -> None:
    """Start processes side by side (each takes a couple of seconds to import)."""
    servers = list(servers)
    if not servers:
        return
    with ThreadPoolExecutor(len(servers)) as pool:
        for future in [pool.submit(s.start, 60.0) for s in servers]:
            future.result()


def signal_process(server: ServerProcess, sig: signal.Signals) -> None:
    assert server.proc is not None and server.proc.poll() is None
    os.kill(server.proc.pid, sig)


def backend_process(data_dir: Path, *extra: str, port: int | None = None) -> ServerProcess:
    """`comfyfleet serve --local-slots 1 --testing-nodes`: a one-at-a-time ComfyUI."""
    return ServerProcess(data_dir, "--local-slots", "1", *extra, port=port)


def backend_queue(backend: ServerProcess) -> tuple[list[str], list[str]]:
    """(running, pending) prompt ids on a backend, from its own /queue."""
    queue = backend.get("/queue")
    return (
        [item[1] for item in queue["queue_running"]],
        [item[1] for item in queue["queue_pending"]],
    )


def backend_history(backend: ServerProcess, prompt_id: str) -> dict[str, Any] | None:
    entry: dict[str, Any] | None = backend.get(f"/history/{prompt_id}").get(prompt_id)
    return entry


def last_message(entry: dict[str, Any]) -> str:
    messages = entry["status"]["messages"]
    return str(messages[-1][0]) if messages else ""


def reset_backend(backend: ServerProcess) -> None:
    """Clear what a previous test left queued or running on a shared backend."""
    if backend.proc is None or backend.proc.poll() is not None:
        return
    backend.post("/queue", {"clear": True})
    backend.post("/interrupt", {})
    poll(
        lambda: backend.get("/prompt")["exec_info"]["queue_remaining"] == 0,
        what=f"backend {backend.port} to go idle",
        timeout=15,
    )


@dataclass
class Fleet:
    """A gateway process and the backends it feeds, by the gateway's name for each."""

    gateway: ServerProcess
    backends: dict[str, ServerProcess]
    stopped: set[ServerProcess] = field(default_factory=set)  # SIGSTOPped, to SIGCONT at the end

    # -- gateway ------------------------------------------------------------------

    def submit(self, prompt: dict[str, Any], client_id: str | None = None) -> str:
        body: dict[str, Any] = {"prompt": prompt}
        if client_id:
            body["client_id"] = client_id
        status, answer = call(self.gateway.url, "POST", "/prompt", body)
        assert status == 200, answer
        prompt_id: str = answer["prompt_id"]
        return prompt_id

    def job(self, prompt_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.gateway.get(f"/api/jobs/{prompt_id}")
        return found

    def lane_of(self, prompt_id: str) -> str | None:
        """The backend name the job ran (or runs) on."""
        lane = self.job(prompt_id)["lane"]
        return lane.removeprefix("backend:") if lane else None

    def wait_job(self, prompt_id: str, *statuses: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def reached() -> bool:
            found.update(self.job(prompt_id))
            return found["status"] in statuses

        poll(reached, what=f"job {prompt_id} to be {statuses}", timeout=timeout)
        return found

    def wait_running_on_backend(self, prompt_id: str, timeout: float = TIMEOUT) -> str:
        """The backend that is now executing the prompt (per its own /queue)."""
        where: list[str] = []

        def running() -> bool:
            lane = self.lane_of(prompt_id)
            if lane is None or lane not in self.backends:
                return False
            if prompt_id in backend_queue(self.backends[lane])[0]:
                where.append(lane)
                return True
            return False

        poll(running, what=f"{prompt_id} to run on a backend", timeout=timeout)
        return where[0]

    def history(self) -> dict[str, Any]:
        return unique_history(self.gateway)

    # -- admin API -------------------------------------------------------------------

    def backend_states(self) -> dict[str, dict[str, Any]]:
        listed = self.gateway.get("/api/fleet/backends")["backends"]
        return {b["name"]: b for b in listed}

    def wait_states(self, expected: dict[str, str], timeout: float = TIMEOUT) -> None:
        def reached() -> bool:
            states = self.backend_states()
            return all(
                name in states and states[name]["state"] == state
                for name, state in expected.items()
            )

        poll(reached, what=f"backends {expected}", timeout=timeout)

    def wait_all_up(self, timeout: float = TIMEOUT) -> None:
        self.wait_states(dict.fromkeys(self.backends, "up"), timeout)

    def restart_gateway(self, *, kill: bool = True) -> None:
        """Stop the gateway (SIGKILL or SIGTERM) and start it again on the same port and data."""
        if kill:
            self.gateway.kill()
        else:
            self.gateway.terminate()
        old = self.gateway
        self.gateway = ServerProcess(old.data_dir, *old.extra, port=old.port)
        self.gateway.start()

    def restart_backend(self, name: str) -> ServerProcess:
        """Start a (killed) backend again: same port, same data dir, same options."""
        old = self.backends[name]
        assert old.proc is not None and old.proc.poll() is not None, "still running"
        self.backends[name] = ServerProcess(old.data_dir, *old.extra, port=old.port)
        return self.backends[name].start()

    # -- processes ---------------------------------------------------------------------

    def stop(self, name: str) -> None:
        backend = self.backends[name]
        self.stopped.add(backend)
        signal_process(backend, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        backend = self.backends[name]
        signal_process(backend, signal.SIGCONT)
        self.stopped.discard(backend)

    def close(self) -> None:
        for backend in list(self.stopped):
            if backend.proc is not None and backend.proc.poll() is None:
                os.kill(backend.proc.pid, signal.SIGCONT)
        self.stopped.clear()
        self.gateway.kill()


def gateway_config(
    path: Path,
    backends: Sequence[tuple[str, ServerProcess]],
    backend_fields: dict[str, Any] | None = None,
    **extra: Any,
) -> Path:
    """A TOML config file with one `[[backends]]` table per (name, process), each with
    `backend_fields` too (e.g. prefetch)."""
    lines = [f"{key} = {json.dumps(value)}" for key, value in extra.items()]
    fields = [f"{key} = {json.dumps(value)}" for key, value in (backend_fields or {}).items()]
    for name, backend in backends:
        lines += ["", "[[backends]]", f'url = "{backend.url}"', f'name = "{name}"', *fields]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# -- prompts -----------------------------------------------------------------------------


# Every unique prompt differs (by colour): a backend answers a repeated one from its cache.
_colors = itertools.count(random.randrange(1 << 23))


def unique_sleep_prompt(seconds: float) -> dict[str, Any]:
    """`sleep_prompt(seconds)` in a colour no other prompt of the session has."""
    return sleep_prompt(seconds, next(_colors))


def fail_prompt(message: str) -> dict[str, Any]:
    """Fail(message) -> PreviewAny: a node error, the same wherever it runs."""
    return {
        "1": {"class_type": "Fail", "inputs": {"message": message}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }
