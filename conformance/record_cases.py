"""Record what a real ComfyUI answers and sends for the cases the fleet tests replay.

    python conformance/record_cases.py --url http://127.0.0.1:8199 --out tests/data/comfyui-fleet

The ComfyUI at --url must load ComfyUI's testing node pack (`--extra-model-paths-config
tests/execution/extra_model_paths.yaml` from its checkout) and comfyfleet's companion pack
(`comfyfleet install-comfyui-pack`). For each case it records: the object_info of every
class the prompt uses, `POST /comfyfleet/validate` (the pack's answer), `POST /prompt`,
every WebSocket frame of the prompt up to its done signal (binary frames with their
payload), the history entry and the bytes of every output file. The prompts use fresh
seeds of nothing: ComfyUI's cache is cleared (`POST /free`) before each case so every
node runs.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import struct
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import websocket

Prompt = dict[str, Any]


def stub_image(content: str) -> dict[str, Any]:
    inputs = {"content": content, "height": 64, "width": 64, "batch_size": 1}
    return {"class_type": "StubImage", "inputs": inputs}


def save(source: str, prefix: str) -> dict[str, Any]:
    inputs = {"images": [source, 0], "filename_prefix": prefix}
    return {"class_type": "SaveImage", "inputs": inputs}


CASES: dict[str, tuple[str, Prompt]] = {
    "custom-validation-refused": (
        "A node's own VALIDATE_INPUTS refuses a literal (TestCustomValidation1, input1=5): "
        "object_info cannot tell.",
        {
            "1": {"class_type": "TestCustomValidation1", "inputs": {"input1": 5, "input2": 3.0}},
            "2": save("1", "refused"),
        },
    ),
    "kwargs-validation-lifts-max": (
        "VALIDATE_INPUTS(**kwargs) takes every input, so ComfyUI skips min/max: input2=5.0 "
        "above its max of 1.0 runs.",
        {
            "1": {"class_type": "TestCustomValidation5", "inputs": {"input1": 0.0, "input2": 5.0}},
            "2": save("1", "kwargs"),
        },
    ),
    "async-validation-refused": (
        "An async VALIDATE_INPUTS refuses (TestAsyncValidation, value 5.0 > threshold 3.0).",
        {
            "1": {"class_type": "TestAsyncValidation", "inputs": {"value": 5.0, "threshold": 3.0}},
            "2": save("1", "async_refused"),
        },
    ),
    "runtime-error": (
        "A node raises while running (TestSyncError): one execution_error.",
        {
            "1": stub_image("BLACK"),
            "2": {"class_type": "TestSyncError", "inputs": {"value": ["1", 0]}},
            "3": save("2", "error"),
        },
    ),
    "one-output-invalid": (
        "Two outputs, one linking to a missing node: 200 with node_errors, the valid one runs.",
        {
            "1": stub_image("BLACK"),
            "3": stub_image("WHITE"),
            "4": {
                "class_type": "StubMask",
                "inputs": {"value": 0.5, "height": 64, "width": 64, "batch_size": 1},
            },
            "5": {
                "class_type": "TestLazyMixImages",
                "inputs": {"image1": ["1", 0], "image2": ["removeme", 0], "mask": ["4", 0]},
            },
            "6": {
                "class_type": "TestLazyMixImages",
                "inputs": {"image1": ["1", 0], "image2": ["3", 0], "mask": ["4", 0]},
            },
            "7": save("5", "invalid_out"),
            "8": save("6", "valid_out"),
        },
    ),
    "save-latent": (
        "SaveLatent of an empty 64x64 latent, batch 2: the `.latent` file (safetensors) and "
        "the `latents` list of its executed frame and history.",
        {
            "1": {
                "class_type": "EmptyLatentImage",
                "inputs": {"width": 64, "height": 64, "batch_size": 2},
            },
            "2": {
                "class_type": "SaveLatent",
                "inputs": {"samples": ["1", 0], "filename_prefix": "latents/rec"},
            },
        },
    ),
    "save-video": (
        "SaveVideo of four 64x64 frames made into a video at 8 fps: the MP4 file ComfyUI "
        "writes (PyAV) and its executed frame and history (`images`, `animated`).",
        {
            "1": {
                "class_type": "EmptyImage",
                "inputs": {"width": 64, "height": 64, "batch_size": 4, "color": 0x336699},
            },
            "2": {"class_type": "CreateVideo", "inputs": {"images": ["1", 0], "fps": 8.0}},
            "3": {
                "class_type": "SaveVideo",
                "inputs": {
                    "video": ["2", 0],
                    "filename_prefix": "video/rec",
                    "format": "auto",
                    "codec": "auto",
                },
            },
        },
    ),
}


class Client:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                status, raw = exc.code, exc.read()
        return status, json.loads(raw) if raw.strip() else None

    def raw(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=60) as response:
            data: bytes = response.read()
            return data


def binary_frame(payload: bytes) -> dict[str, Any]:
    (event_code,) = struct.unpack(">I", payload[:4])
    return {"binary": True, "event_code": event_code, "b64": base64.b64encode(payload).decode()}


def frames_until_done(ws: websocket.WebSocket, prompt_id: str) -> list[Any]:
    frames: list[Any] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        message = ws.recv()
        if isinstance(message, bytes):
            frames.append(binary_frame(message))
            continue
        frame = json.loads(message)
        frames.append(frame)
        data = frame.get("data") or {}
        if frame["type"] == "executing" and data.get("node") is None:
            if data.get("prompt_id") == prompt_id:
                return frames
    raise TimeoutError(f"no done signal for {prompt_id}")


def record(client: Client, name: str, description: str, prompt: Prompt) -> dict[str, Any]:
    classes = sorted({node["class_type"] for node in prompt.values()})
    object_info = {}
    for class_type in classes:
        object_info.update(client.call("GET", f"/object_info/{class_type}")[1])
    client.call("POST", "/free", {"unload_models": False, "free_memory": True})
    status, answer = client.call("POST", "/comfyfleet/validate", {"prompt": prompt})
    case: dict[str, Any] = {
        "case": name,
        "description": description,
        "object_info": object_info,
        "validate": {"status": status, "body": answer},
    }
    client_id = uuid.uuid4().hex
    ws = websocket.WebSocket()
    ws.connect(f"{client.url.replace('http', 'ws', 1)}/ws?clientId={client_id}", timeout=60)
    try:
        greeting = json.loads(ws.recv())
        body = {"prompt": prompt, "client_id": client_id}
        status, answer = client.call("POST", "/prompt", body)
        case["submit"] = {"request": body, "status": status, "body": answer}
        if status != 200:
            return case
        prompt_id = answer["prompt_id"]
        case["frames"] = [greeting, *frames_until_done(ws, prompt_id)]
    finally:
        ws.close()
    entry = client.call("GET", f"/history/{prompt_id}")[1][prompt_id]
    case["history"] = entry
    case["files"] = {}
    for ui in entry.get("outputs", {}).values():
        for item in [*ui.get("images", []), *ui.get("latents", [])]:
            query = urllib.parse.urlencode({k: item[k] for k in ("filename", "subfolder", "type")})
            data = client.raw(f"/view?{query}")
            key = f"{item['type']}/{item['subfolder']}/{item['filename']}"
            case["files"][key] = base64.b64encode(data).decode()
    return case


def scrubbed(text: str) -> str:
    """The recording with the recording machine's folders (in tracebacks) as `<path>`."""
    return re.sub(r'File \\"/[^"\\]*/', 'File \\"<path>/', text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8199")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", help="record only these cases")
    args = parser.parse_args()
    client = Client(args.url)
    stats = client.call("GET", "/system_stats")[1]["system"]
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (description, prompt) in CASES.items():
        if args.only and name not in args.only:
            continue
        case = record(client, name, description, prompt)
        case = {
            "comfyui_version": stats.get("comfyui_version"),
            "recorded": time.strftime("%Y-%m-%d"),
            **case,
        }
        path = args.out / f"{name}.json"
        path.write_text(scrubbed(json.dumps(case, indent=1)) + "\n", encoding="utf-8")
        print(f"{path}: validate {case['validate']['status']}, submit {case['submit']['status']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
