"""schemathesis against a live `comfyfleet serve`, driven by docs/openapi.json.

Every documented operation (the `/api` aliases included) gets generated requests, valid
and invalid, and schemathesis' checks on each answer: never a 5xx, only documented status
codes and content types, bodies that match their documented schema, schema-valid requests
accepted and schema-violating ones refused. The few checks that cannot hold for an
operation are switched off for it alone, each with its reason, in NOT_APPLICABLE.
Afterwards the server must still answer GET /prompt. Backends the run adds are pointed
at a loopback port where nothing listens, so no generated host is ever contacted.

Short by default (a few examples per operation, reproducible); `COMFYFLEET_FUZZ_LONG=1`
runs many more, with a fresh random seed each time.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings

from comfyfleet.lanes.fleet import URL
from tests.fuzz.harness import LONG, TIMEOUT_MARK_SECONDS
from tests.servers import ServerProcess

pytestmark = pytest.mark.timeout(TIMEOUT_MARK_SECONDS)

SPEC_PATH = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
#: Examples per operation and phase (schemathesis' coverage phase adds its own cases).
MAX_EXAMPLES = 1000 if LONG else 20
#: Seconds one request may take before the run counts it as a hang.
REQUEST_TIMEOUT = 30.0 if LONG else 15.0

#: (operationId, check) -> why the check cannot hold for that operation.
NOT_APPLICABLE: dict[tuple[str, str], str] = {
    **{
        (operation_id, "positive_data_acceptance"): (
            "a prompt's validity is semantic (node classes, links, input types): most "
            "schema-valid graphs get ComfyUI's 400 with node_errors, as they should"
        )
        for operation_id in ("postPrompt", "validatePrompt", "estimatePromptCost", "submitJobV2")
    },
    ("listJobsV2", "positive_data_acceptance"): (
        "a cursor is one the server handed out (`next_cursor`): any other string is v2's "
        "400 `invalid_cursor`"
    ),
    **{
        (operation_id, "negative_data_rejection"): (
            "ComfyUI answers these with 200 whatever the body holds: wrong types and non-string "
            "ids are ignored, flags are read by truthiness. comfyfleet keeps that on purpose "
            "(clients written against ComfyUI send such bodies); the schema says what to send"
        )
        for operation_id in ("postQueue", "postHistory", "postInterrupt", "free")
    },
    **{
        (operation_id, "negative_data_rejection"): (
            "a multipart form holds only text: the type violations schemathesis makes (numbers, "
            "null, arrays) arrive as valid text fields, or as no field at all"
        )
        for operation_id in ("uploadImage", "uploadMask", "uploadAssetV2")
    },
    ("uploadAssetV2", "positive_data_acceptance"): (
        "the generator adds form fields whose names hold control characters: aiohttp cannot "
        "read such a part's header, and the form is refused as malformed (400)"
    ),
    **{
        (operation_id, "positive_data_acceptance"): (
            "a name the filesystem refuses (too long, a folder's) gets ComfyUI's 400: which "
            "names a filesystem takes is not a schema's to say"
        )
        for operation_id in ("postUserdata", "moveUserdata", "deleteUserdata")
    },
    ("listUserdataV2", "positive_data_acceptance"): (
        "a path that leads out of the user folder, or names a file, gets ComfyUI's 400"
    ),
    ("postUsers", "positive_data_acceptance"): (
        "there are no user profiles to create (users are the tenants of tokens): every "
        "request is refused"
    ),
    **{
        (operation_id, "positive_data_acceptance"): (
            "schemathesis sends plain GETs: without an Upgrade header the answer is the "
            "documented 400, never the 101"
        )
        for operation_id in ("websocket", "fleetWebsocket")
    },
}


def _config() -> schemathesis.Config:
    operations: dict[str, dict[str, Any]] = {}
    for (operation_id, check), _why in NOT_APPLICABLE.items():
        entry = operations.setdefault(
            operation_id, {"include-operation-id": operation_id, "checks": {}}
        )
        entry["checks"][check] = {"enabled": False}
    return schemathesis.Config.from_dict(
        {
            "request-timeout": REQUEST_TIMEOUT,
            "generation": {"max-examples": MAX_EXAMPLES},
            "operations": list(operations.values()),
        }
    )


schema = schemathesis.openapi.from_path(SPEC_PATH, config=_config())

#: Cases sent per operation, for the summary test_server_still_serves prints (`-s`).
SENT: Counter[str] = Counter()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("schemathesis"), "--shutdown-grace", "0.2")
    with process:
        yield process


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as http:
        yield http


#: The host of a url the server would take (URL, as POST /api/fleet/backends checks it).
_HOST = re.compile(r"^(https?://)[^/]+")


def _keep_backends_local(case: schemathesis.Case[Any]) -> None:
    """Point a backend the case would add at 127.0.0.1:9, where nothing listens.

    The server tries to reach every backend it is given; a host the generator made up must
    not be contacted. Only urls the server accepts are changed, and the host stays a valid
    one, so a case that was schema-valid stays valid and an invalid one stays invalid.
    """
    if case.operation.label != "POST /api/fleet/backends":
        return

    def local(url: Any) -> Any:
        if not isinstance(url, str) or not URL.fullmatch(url.rstrip("/")):
            return url
        return _HOST.sub(r"\g<1>127.0.0.1:9", url)

    if isinstance(case.body, str):
        case.body = local(case.body)
    elif isinstance(case.body, dict) and "url" in case.body:
        case.body = {**case.body, "url": local(case.body["url"])}


@schema.parametrize()
@settings(
    deadline=None,  # a real server: timing varies, hangs are caught by REQUEST_TIMEOUT
    derandomize=not LONG,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
)
def test_operation(
    case: schemathesis.Case[Any], server: ServerProcess, session: requests.Session
) -> None:
    _keep_backends_local(case)
    SENT[case.operation.label] += 1
    case.call_and_validate(base_url=server.url, session=session, timeout=REQUEST_TIMEOUT)


def test_server_still_serves(server: ServerProcess) -> None:
    """After the run: GET /prompt answers, and the server logged no unhandled error."""
    server.post("/queue", {"clear": True})
    server.post("/interrupt", {})
    for backend in server.get("/api/fleet/backends")["backends"]:
        reply = requests.delete(
            f"{server.url}/api/fleet/backends/{backend['name']}",
            params={"timeout": "0"},
            timeout=REQUEST_TIMEOUT,
        )
        assert reply.status_code in (200, 404), reply.text
    assert "queue_remaining" in server.get("/prompt")["exec_info"]
    assert server.get("/api/fleet/backends") == {"backends": []}
    log = server.log.read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in log, log[-5000:]
    print(f"\nschemathesis: {sum(SENT.values())} cases over {len(SENT)} operations")
