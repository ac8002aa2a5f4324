"""pytest plugin: run ComfyUI's own tests/execution suite through comfyfleet.

Load it with `-p cf_gateway_plugin` (its folder on PYTHONPATH), from the ComfyUI
checkout, with ComfyUI's venv active. The suite's test files are not changed.

Each `_server` fixture of the suite starts `subprocess.Popen(['python', 'main.py',
<flags>, '--port', P])` and later calls `p.kill()`. While a `_server` fixture sets
up, this plugin swaps `subprocess.Popen` so that exactly that call starts instead:

  CF_MODE=gateway  (configurations A and B)
      CF_BACKENDS real ComfyUI processes with the SAME flags, except the port,
      which becomes CF_BACKEND_PORTS[i]; then `comfyfleet serve` on P with
      `--local-slots 0 --backend http://<listen>:<port> ...` and a fresh
      --data-dir. It returns only once every backend answers
      /object_info/StubImage and the gateway lists every backend `up` with its
      node classes read and answers /object_info/StubImage itself.
  CF_MODE=worker   (configuration W)
      as `gateway` with one ComfyUI, but the gateway gets no --backend: a
      `comfyfleet worker --backend <that ComfyUI>` connects to it (a worker token
      in the gateway's config file) and is its only lane. Ready once the worker's
      lane is `up` with its node classes read.
  CF_MODE=builtin  (configuration C)
      only `comfyfleet serve` on P with `--local-slots CF_LOCAL_SLOTS
      --custom-nodes CF_CUSTOM_NODES` and a fresh --data-dir; it waits for
      /system_stats (the testing nodes may fail to import; that is the point).
  CF_MODE=plain    (baseline with the companion pack)
      the suite's own ComfyUI, with CF_PACK_DIR's custom nodes added.
  CF_MODE unset or "off": the plugin does nothing (plain baseline).

With CF_PACK_DIR (a folder holding `comfyfleet_pack`, made by `comfyfleet
install-comfyui-pack`), every ComfyUI started gets one more
`--extra-model-paths-config` whose `custom_nodes` is that folder: the companion pack
loads without touching the ComfyUI checkout.

`p.kill()` then stops the whole group: SIGTERM to comfyfleet (SIGKILL after
CF_STOP_GRACE s), SIGKILL to each ComfyUI (as the suite does), and waits
until all have exited.

Environment:
  CF_BIN            comfyfleet executable (required unless CF_MODE is off)
  CF_BACKENDS       number of ComfyUI backends (default 1)
  CF_BACKEND_PORTS  comma-separated ports (default 8190,8191,...)
  CF_EXTRA_ARGS     extra arguments for `comfyfleet serve` (shell-split)
  CF_CUSTOM_NODES   builtin mode: folder for --custom-nodes
  CF_LOCAL_SLOTS    builtin mode: --local-slots (default 8)
  CF_LOG_DIR        where each process's output goes (default: a temp folder,
                    printed at start); one file per process per fixture
  CF_KEEP_DATA      1: keep each gateway --data-dir (under CF_LOG_DIR)
  CF_READY_TIMEOUT  seconds to wait for readiness (default 180)
  COMFY_PYTHON      interpreter for main.py (default: this pytest's sys.executable)
  CF_SERVER_PYTHONPATH  PYTHONPATH given to the comfyfleet process (e.g. the ComfyUI
                    checkout, so that C's testing nodes can import comfy_execution)
  CF_PACK_DIR       a custom_nodes folder holding the companion pack (see above)
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest

_REAL_POPEN = subprocess.Popen
_COUNTER = itertools.count(1)
_LOG_DIR: str | None = None


def _mode() -> str:
    return os.environ.get("CF_MODE", "off").strip().lower()


def _log_dir() -> str:
    global _LOG_DIR
    if _LOG_DIR is None:
        _LOG_DIR = os.environ.get("CF_LOG_DIR") or tempfile.mkdtemp(prefix="cf_suite_logs_")
        os.makedirs(_LOG_DIR, exist_ok=True)
    return _LOG_DIR


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) != 0


def _wait_port_free(host: str, port: int, timeout: float = 30.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if _port_free(host, port):
            return
        time.sleep(0.2)
    raise RuntimeError(f"port {host}:{port} still in use after {timeout}s")


def _get(url: str, timeout: float = 3.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def _wait_http(url: str, procs: list, timeout: float, check=None) -> None:
    end = time.time() + timeout
    last = None
    while time.time() < end:
        for name, p, _log in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode} while waiting for {url}")
        try:
            status, body = _get(url)
            if status == 200 and (check is None or check(body)):
                return
            last = f"HTTP {status}"
        except (urllib.error.URLError, ConnectionError, OSError, ValueError) as exc:
            last = repr(exc)
        time.sleep(0.3)
    raise RuntimeError(f"timed out after {timeout}s waiting for {url} (last: {last})")


class _Group:
    """Quacks like the Popen the suite expects: it only calls .kill()."""

    def __init__(self, procs: list, cleanup: list[str]):
        self.procs = procs  # [(name, Popen, logfile)], gateway last
        self.cleanup = cleanup
        self._stopped = False

    @property
    def pid(self) -> int:
        return self.procs[-1][1].pid

    @property
    def returncode(self):
        return self.procs[-1][1].returncode

    def poll(self):
        return self.procs[-1][1].poll()

    def wait(self, timeout=None):
        for _n, p, _l in self.procs:
            p.wait(timeout)
        return self.returncode

    def _stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        grace = float(os.environ.get("CF_STOP_GRACE", "10"))
        # comfyfleet first (SIGTERM, graceful), then the ComfyUI backends (SIGKILL, as the suite).
        for name, p, log in reversed(self.procs):
            if p.poll() is not None:
                continue
            if name == "comfyfleet":
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(grace)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            else:
                p.kill()
                p.wait()
        for _n, _p, log in self.procs:
            with contextlib.suppress(Exception):
                log.close()
        for path in self.cleanup:
            shutil.rmtree(path, ignore_errors=True)

    kill = _stop
    terminate = _stop

    def __del__(self):
        with contextlib.suppress(Exception):
            self._stop()


def _pack_args() -> list[str]:
    """The extra ComfyUI flags that load the companion pack (none without CF_PACK_DIR)."""
    pack_dir = os.environ.get("CF_PACK_DIR")
    if not pack_dir:
        return []
    config = os.path.join(_log_dir(), "comfyfleet_pack_paths.yaml")
    if not os.path.exists(config):
        with open(config, "w") as out:
            out.write(f"comfyfleet:\n    custom_nodes: {os.path.abspath(pack_dir)}\n")
    return ["--extra-model-paths-config", config]


def _opt(args: list[str], flag: str, default=None):
    if flag in args:
        i = args.index(flag)
        if i + 1 < len(args):
            return args[i + 1]
    return default


def _set_opt(args: list[str], flag: str, value: str) -> list[str]:
    args = list(args)
    i = args.index(flag)
    args[i + 1] = value
    return args


def _spawn(name: str, argv: list[str], tag: str, env=None):
    if name == "comfyfleet" and os.environ.get("CF_SERVER_PYTHONPATH"):
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.environ["CF_SERVER_PYTHONPATH"]
    path = os.path.join(_log_dir(), f"{tag}-{name}.log")
    log = open(path, "w", buffering=1)
    log.write("$ " + shlex.join(argv) + "\n")
    p = _REAL_POPEN(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    return (name, p, log)


def _launch(suite_args: list[str]) -> _Group:
    mode = _mode()
    cf_bin = os.environ.get("CF_BIN")
    if not cf_bin:
        raise RuntimeError("CF_BIN (the comfyfleet executable) is not set")
    listen = _opt(suite_args, "--listen", "127.0.0.1")
    port = int(_opt(suite_args, "--port", "8188"))
    timeout = float(os.environ.get("CF_READY_TIMEOUT", "180"))
    n = next(_COUNTER)
    tag = f"{n:02d}"
    procs: list = []
    cleanup: list[str] = []
    keep = os.environ.get("CF_KEEP_DATA") == "1"
    data_dir = (
        os.path.join(_log_dir(), f"{tag}-data")
        if keep
        else tempfile.mkdtemp(prefix=f"cf_data_{tag}_")
    )
    os.makedirs(data_dir, exist_ok=True)
    if not keep:
        cleanup.append(data_dir)
    extra = shlex.split(os.environ.get("CF_EXTRA_ARGS", ""))
    try:
        _wait_port_free(listen, port)
        if mode in ("gateway", "worker"):
            count = int(os.environ.get("CF_BACKENDS", "1"))
            ports_env = os.environ.get("CF_BACKEND_PORTS", "")
            ports = [int(x) for x in ports_env.split(",") if x.strip()] or [
                8190 + i for i in range(count)
            ]
            if len(ports) < count:
                raise RuntimeError(f"CF_BACKEND_PORTS has {len(ports)} ports for {count} backends")
            py = os.environ.get("COMFY_PYTHON", sys.executable)
            urls = []
            for i in range(count):
                bport = ports[i]
                _wait_port_free(listen, bport)
                bargs = _set_opt(suite_args, "--port", str(bport))
                # 'python' -> the interpreter; 'main.py' and flags as given, plus the pack
                bargs = [py, *bargs[1:], *_pack_args()]
                procs.append(_spawn(f"comfyui{i + 1}-{bport}", bargs, tag))
                urls.append(f"http://{listen}:{bport}")
            for url in urls:
                _wait_http(url + "/object_info/StubImage", procs, timeout)
            gargs = [cf_bin, "serve", "--host", listen, "--port", str(port), "--data-dir", data_dir,
                     "--local-slots", "0"]
            if mode == "worker":
                token = "conformance-worker-" + os.urandom(8).hex()
                config = os.path.join(data_dir, "workers.toml")
                with open(config, "w") as out:
                    out.write(f'[[worker_tokens]]\nname = "w"\ntoken = "{token}"\n')
                gargs += ["--config", config]
            else:
                for url in urls:
                    gargs += ["--backend", url]
            gargs += extra
            procs.append(_spawn("comfyfleet", gargs, tag))
            if mode == "worker":
                _wait_http(f"http://{listen}:{port}/system_stats", procs, timeout)
                wargs = [cf_bin, "worker", "--gateway", f"http://{listen}:{port}",
                         "--backend", urls[0], "--grace", "0"]
                env = {**os.environ, "COMFYFLEET_WORKER_TOKEN": token}
                procs.append(_spawn("worker", wargs, tag, env=env))

            def all_up(body: bytes) -> bool:
                bs = json.loads(body).get("backends", [])
                return len(bs) == count and all(
                    b.get("state") == "up" and b.get("node_classes", 0) > 0 for b in bs
                )

            base = f"http://{listen}:{port}"
            _wait_http(base + "/api/fleet/backends", procs, timeout, all_up)
            _wait_http(base + "/object_info/StubImage", procs, timeout)
        elif mode == "builtin":
            gargs = [cf_bin, "serve", "--host", listen, "--port", str(port), "--data-dir", data_dir,
                     "--local-slots", os.environ.get("CF_LOCAL_SLOTS", "8")]
            nodes = os.environ.get("CF_CUSTOM_NODES")
            if nodes:
                gargs += ["--custom-nodes", nodes]
            gargs += extra
            procs.append(_spawn("comfyfleet", gargs, tag))
            _wait_http(f"http://{listen}:{port}/system_stats", procs, timeout)
        else:
            raise RuntimeError(f"unknown CF_MODE {mode!r}")
    except BaseException:
        _Group(procs, cleanup).kill()
        raise
    sys.stderr.write(f"[cf_gateway_plugin] fixture {tag}: started {[p[0] for p in procs]}\n")
    return _Group(procs, cleanup)


def _patched_popen(args, *a, **kw):
    if (
        isinstance(args, (list, tuple))
        and len(args) >= 2
        and os.path.basename(str(args[0])).startswith("python")
        and args[1] == "main.py"
    ):
        if _mode() == "plain":
            return _REAL_POPEN([*map(str, args), *_pack_args()], *a, **kw)
        return _launch([str(x) for x in args])
    return _REAL_POPEN(args, *a, **kw)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if _mode() in ("", "off") or fixturedef.argname != "_server":
        yield
        return
    subprocess.Popen = _patched_popen
    try:
        yield
    finally:
        subprocess.Popen = _REAL_POPEN


def pytest_report_header(config):
    mode = _mode()
    if mode in ("", "off"):
        return "cf_gateway_plugin: off (plain ComfyUI)"
    if mode == "plain":
        return f"cf_gateway_plugin: plain ComfyUI, pack from {os.environ.get('CF_PACK_DIR')}"
    return (
        f"cf_gateway_plugin: mode={mode} backends={os.environ.get('CF_BACKENDS', '1')} "
        f"logs={_log_dir()}"
    )
