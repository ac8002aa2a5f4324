"""Record what a real ComfyUI answers on the routes its graph editor calls.

    python conformance/record_editor_routes.py --url http://127.0.0.1:8341 \\
        --out tests/data/comfyui-editor/routes.json

The ComfyUI at --url must start with an empty `--user-directory` (the steps create, list,
move and delete files there, starting from nothing) and an empty input folder. Each step
keeps the request, the status, the Content-Type and the body; absolute paths in answers
are replaced by `<path>`. tests/integration/server/test_editor_replay.py replays the
steps against comfyfleet.
"""

from __future__ import annotations

import argparse
import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

SETTINGS = [
    ("GET", "/api/users", None),
    ("GET", "/api/settings", None),
    ("POST", "/api/settings/Comfy.InstalledVersion", b'"1.27.10"'),
    ("GET", "/api/settings/Comfy.InstalledVersion", None),
    ("GET", "/api/settings/Comfy.Unknown", None),
    ("POST", "/api/settings", b'{"Comfy.TutorialCompleted": true, "Comfy.Locale": "en"}'),
    ("GET", "/api/settings", None),
    ("GET", "/api/users", None),
]
USERDATA = [
    ("GET", "/api/userdata?dir=workflows&recurse=true&split=false&full_info=true", None),
    ("GET", "/api/userdata", None),
    ("GET", "/api/userdata/comfy.templates.json", None),
    ("POST", "/api/userdata/workflows%2Fa.json?overwrite=false&full_info=true", b'{"a": 1}'),
    ("POST", "/api/userdata/workflows%2Fa.json?overwrite=false&full_info=true", b'{"a": 2}'),
    ("POST", "/api/userdata/workflows%2Fa.json", b'{"a": 3}'),
    ("POST", "/api/userdata/workflows%2Fsub%2Fc.json?full_info=false", b"{}"),
    ("GET", "/api/userdata?dir=workflows&recurse=true&split=false&full_info=true", None),
    ("GET", "/api/userdata?dir=workflows", None),
    ("GET", "/api/userdata?dir=workflows&recurse=true", None),
    ("GET", "/api/userdata?dir=workflows&recurse=true&split=true", None),
    ("GET", "/api/userdata/workflows%2Fa.json", None),
    ("GET", "/api/v2/userdata", None),
    ("GET", "/api/v2/userdata?path=workflows", None),
    ("GET", "/api/v2/userdata?path=missing", None),
    ("GET", "/api/v2/userdata?path=workflows%2Fa.json", None),
    ("POST", "/api/userdata/workflows%2Fa.json/move/workflows%2Fb.json?full_info=true", None),
    ("POST", "/api/userdata/workflows%2Fmissing.json/move/workflows%2Fd.json", None),
    (
        "POST",
        "/api/userdata/workflows%2Fb.json/move/workflows%2Fsub%2Fc.json?overwrite=false",
        None,
    ),
    ("POST", "/api/userdata/workflows%2Fb.json/move/workflows%2Fe.json", None),
    ("GET", "/api/userdata/..%2F..%2Fsecret.txt", None),
    ("GET", "/api/userdata?dir=..%2F..", None),
    ("DELETE", "/api/userdata/workflows%2Fe.json", None),
    ("DELETE", "/api/userdata/workflows%2Fe.json", None),
    ("GET", "/api/userdata/user.css", None),
]
OTHERS = [
    ("GET", "/api/i18n", None),
    ("GET", "/api/workflow_templates", None),
    ("GET", "/api/experiment/models", None),
    ("GET", "/api/experiment/models/checkpoints", None),
    ("GET", "/api/experiment/models/nonexistent", None),
    ("GET", "/api/view_metadata/checkpoints?filename=missing.safetensors", None),
    ("GET", "/api/view_metadata/checkpoints", None),
    ("GET", "/internal/files/input", None),
    ("GET", "/internal/files/elsewhere", None),
    ("GET", "/internal/folder_paths", None),
    ("GET", "/internal/logs/raw", None),
    ("GET", "/internal/logs", None),
    ("PATCH", "/internal/logs/subscribe", b'{"clientId": "recorder", "enabled": false}'),
    ("GET", "/api/extensions", None),
    ("GET", "/", None),
    ("GET", "/extensions/core/groupNode.js", None),
    ("GET", "/no/such/file.js", None),
    ("GET", "/upload/image", None),
]
#: Absolute paths of the recording machine (URL paths such as /extensions/... stay).
_PATH = re.compile(r"/(?:tmp|work|home|root|usr|opt|var|srv|mnt)(?:/[^\s\"']*)?")


def scrub(value: Any) -> Any:
    """Absolute paths in strings become `<path>` (the recording machine's folders)."""
    if isinstance(value, str):
        return _PATH.sub("<path>", value)
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items()}
    return value


def call(url: str, method: str, path: str, body: bytes | None) -> dict[str, Any]:
    request = urllib.request.Request(url + path, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, headers, raw = response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        status, headers, raw = exc.code, exc.headers, exc.read()
    step: dict[str, Any] = {"method": method, "path": path, "status": status}
    if body is not None:
        step["request_body"] = body.decode()
    ctype = headers.get("Content-Type")
    step["response_content_type"] = ctype
    if ctype and ctype.startswith("application/json") and path != "/internal/logs":
        step["response_json"] = scrub(json.loads(raw))
    elif ctype and ctype.startswith("text/plain"):
        step["response_text"] = raw.decode()
    else:
        step["response_length"] = len(raw)
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    groups = {"settings": SETTINGS, "userdata": USERDATA, "others": OTHERS}
    steps = {
        name: [call(args.url.rstrip("/"), *step) for step in group]
        for name, group in groups.items()
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "comfyui_version": "0.3.64",
        "frontend_version": "1.27.10",
        "description": "The routes ComfyUI's graph editor calls, from a fresh user directory.",
        "steps": steps,
    }
    args.out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
