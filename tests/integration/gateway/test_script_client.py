"""A client written the way ComfyUI's `script_examples/websockets_api_example.py` is.

It knows nothing of comfyfleet: `websocket-client` and `urllib` against `comfyfleet
serve` in a child process. Connect with a clientId, queue a prompt, read frames until
`executing` with node None for that prompt, then fetch the history and every image.
"""

from __future__ import annotations

import io
import json
import urllib.parse
import urllib.request
import uuid
from typing import Any

import websocket  # websocket-client, as the ComfyUI example uses
from PIL import Image

PROMPT = {
    "3": {
        "class_type": "EmptyImage",
        "inputs": {"width": 48, "height": 32, "batch_size": 2, "color": 0x336699},
    },
    "5": {"class_type": "ImageInvert", "inputs": {"image": ["3", 0]}},
    "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "example", "images": ["5", 0]}},
    "10": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}},
}


class ExampleClient:
    def __init__(self, server_address: str) -> None:
        self.server_address = server_address
        self.client_id = str(uuid.uuid4())

    def queue_prompt(self, prompt: dict[str, Any]) -> dict[str, Any]:
        p = {"prompt": prompt, "client_id": self.client_id}
        data = json.dumps(p).encode("utf-8")
        req = urllib.request.Request(f"http://{self.server_address}/prompt", data=data)
        result: dict[str, Any] = json.loads(urllib.request.urlopen(req).read())
        return result

    def get_image(self, filename: str, subfolder: str, folder_type: str) -> bytes:
        data = {"filename": filename, "subfolder": subfolder, "type": folder_type}
        url_values = urllib.parse.urlencode(data)
        url = f"http://{self.server_address}/view?{url_values}"
        with urllib.request.urlopen(url) as response:
            body: bytes = response.read()
            return body

    def get_history(self, prompt_id: str) -> dict[str, Any]:
        url = f"http://{self.server_address}/history/{prompt_id}"
        with urllib.request.urlopen(url) as response:
            result: dict[str, Any] = json.loads(response.read())
            return result

    def get_images(self, ws: websocket.WebSocket, prompt: dict[str, Any]) -> dict[str, list[bytes]]:
        prompt_id = self.queue_prompt(prompt)["prompt_id"]
        self.messages: list[dict[str, Any]] = []
        output_images: dict[str, list[bytes]] = {}
        while True:
            out = ws.recv()
            if isinstance(out, str):
                message = json.loads(out)
                self.messages.append(message)
                if message["type"] == "executing":
                    data = message["data"]
                    if data["node"] is None and data["prompt_id"] == prompt_id:
                        break  # Execution is done
            else:
                continue  # previews are binary data

        history = self.get_history(prompt_id)[prompt_id]
        for node_id in history["outputs"]:
            node_output = history["outputs"][node_id]
            images_output = []
            if "images" in node_output:
                for image in node_output["images"]:
                    image_data = self.get_image(
                        image["filename"], image["subfolder"], image["type"]
                    )
                    images_output.append(image_data)
            output_images[node_id] = images_output
        self.prompt_id = prompt_id
        return output_images


def test_the_comfyui_websocket_example_runs_unchanged(server_process: Any) -> None:
    client = ExampleClient(f"127.0.0.1:{server_process.port}")
    ws = websocket.WebSocket()
    url = f"ws://{client.server_address}/ws?clientId={client.client_id}"
    ws.connect(url, timeout=30)  # type: ignore[no-untyped-call]
    try:
        images = client.get_images(ws, PROMPT)
    finally:
        ws.close()

    assert sorted(images) == ["10", "9"]
    # ComfyUI's own pixels: 1 - 0.6 is 0.39999998 in float32, which truncates to 0x65.
    for node_id, expected in (("9", (0xCC, 0x99, 0x65)), ("10", (0x33, 0x66, 0x99))):
        assert len(images[node_id]) == 2, node_id
        for data in images[node_id]:
            image = Image.open(io.BytesIO(data))
            assert (image.format, image.size) == ("PNG", (48, 32))
            assert image.convert("RGB").getpixel((0, 0)) == expected, node_id
    types = [m["type"] for m in client.messages]
    assert types[0] == "status" and client.messages[0]["data"]["sid"] == client.client_id
    assert types[-2:] == ["status", "executing"]
    assert "execution_success" in types
    assert {m["data"]["prompt_id"] for m in client.messages if m["type"] != "status"} == {
        client.prompt_id
    }
