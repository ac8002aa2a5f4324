"""Webhooks end to end: a gateway in this process, receivers on loopback that verify every
signature with the Standard Webhooks verifier."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.domain.jobs import NewJob
from comfyfleet.domain.webhooks import WebhookTarget
from comfyfleet.server.config import AuthToken
from comfyfleet.webhooks import WebhookConfig
from comfyfleet.webhooks.signing import parse_secret
from tests.integration.gateway.wire import Served, poll, save_prompt, serve, sleep_prompt
from tests.integration.webhooks.receiver import Receiver, new_secret

FAILING = {
    "1": {
        "class_type": "EmptyImage",
        "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
    },
    "2": {"class_type": "Fail", "inputs": {"message": "boom", "value": ["1", 0]}},
    "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
}


def target(name: str, receiver: Receiver, secret: str, **kw: Any) -> WebhookConfig:
    return WebhookConfig(WebhookTarget(name, receiver.url, **kw), parse_secret(secret))


async def deliveries(served: Served, query: str = "") -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await served.get(f"/api/webhooks/deliveries?{query}"))[
        "deliveries"
    ]
    return found


async def test_every_kind_of_end_is_delivered_signed_with_its_outputs(tmp_path: Path) -> None:
    secret = new_secret()
    async with (
        Receiver(secret) as receiver,
        serve(tmp_path, local_slots=1, webhooks=(target("all", receiver, secret),)) as served,
    ):
        saved = await served.submit(save_prompt(200, "hooked"))
        failed = await served.submit(FAILING)
        await served.wait_job(failed, "failed")
        slow = await served.submit(sleep_prompt(30))
        await served.wait_job(slow, "in_progress")
        waiting = await served.submit(save_prompt(1, "never"))
        assert (await served.post("/queue", {"delete": [waiting]})).status == 200
        assert (await served.post("/interrupt", {"prompt_id": slow})).status == 200
        got = {r.prompt_id: r.body for r in (await receiver.wait_for(4)).values()}

        assert {p: body["type"] for p, body in got.items()} == {
            saved: "job.succeeded",
            failed: "job.failed",
            slow: "job.interrupted",
            waiting: "job.cancelled",
        }
        assert receiver.unverified == 0
        success = got[saved]["data"]
        assert success["status"] == "success" and success["error"] is None
        assert success["run_seconds"] >= 0 and success["finished_at"].endswith("Z")
        [image] = success["outputs"]["2"]["images"]
        assert image["url"].startswith(f"http://127.0.0.1:{served.gateway.config.port}/view?")
        view = image["url"].replace(f":{served.gateway.config.port}/", f":{served.server.port}/")
        async with served.session.get(view) as response:
            assert response.status == 200 and response.content_type == "image/png"
        assert got[failed]["data"]["error"]["exception_message"].strip() == "boom"
        assert got[waiting]["data"]["outputs"] == {}
        listed = await deliveries(served, "state=delivered")
        assert sorted(d["prompt_id"] for d in listed) == sorted(got)
        assert all(d["target"] == "all" and d["attempts"] == 1 for d in listed)


async def test_a_prompts_own_webhook_gets_the_events_it_names(tmp_path: Path) -> None:
    secret = new_secret()
    settings = {"webhooks_secret": secret, "webhooks_allow_private": True}
    async with Receiver(secret) as receiver, serve(tmp_path, **settings) as served:
        only_failures = {"webhook_url": receiver.url, "webhook_events": ["job.failed"]}
        quiet = await served.submit(save_prompt(1, "a"), extra_data=only_failures)
        loud = await served.submit(FAILING, extra_data=only_failures)
        every = await served.submit(save_prompt(2, "b"), extra_data={"webhook_url": receiver.url})
        await served.wait_job(quiet, "completed")
        got = await receiver.wait_for(2)
        assert sorted((r.prompt_id, r.body["type"]) for r in got.values()) == sorted(
            [(loud, "job.failed"), (every, "job.succeeded")]
        )
        # Recorded with the job's end: a delivery that is not there never will be.
        assert await deliveries(served, f"prompt_id={quiet}") == []
        [mine] = await deliveries(served, f"prompt_id={every}")
        assert mine["target"] is None and mine["url"] == receiver.url
        # A backend is never told of the webhook: this gateway sends it.
        job = await served.job(every)
        assert job["extra_data"]["webhook_url"] == receiver.url


BAD_WEBHOOKS = [
    ({"webhook_url": "ftp://hooks.example.com/x"}, "http or https"),
    ({"webhook_url": "https://hooks.example.com/" + "x" * 2100}, "longer than"),
    ({"webhook_url": "https://user:pw@hooks.example.com/"}, "credentials"),
    ({"webhook_url": "https://hooks.example.com/a b"}, "blanks"),
    ({"webhook_url": 12}, "string"),
    ({"webhook_url": "https://hooks.example.com/", "webhook_events": ["job.done"]}, "unknown"),
    ({"webhook_url": "https://hooks.example.com/", "webhook_events": "job.failed"}, "list"),
    ({"webhook_events": ["job.failed"]}, "goes with webhook_url"),
    ({"webhook_url": "https://hooks.example.com/", "note": "\x00"}, "NUL"),
    ({"webhook_url": "http://127.0.0.1:9/hook"}, "non-public"),
    ({"webhook_url": "http://10.1.2.3/hook"}, "non-public"),
    ({"webhook_url": "http://169.254.169.254/latest"}, "non-public"),
    ({"webhook_url": "http://[::1]:8080/"}, "non-public"),
    ({"webhook_url": "http://[::ffff:192.168.0.1]/"}, "non-public"),
    ({"webhook_url": "http://localhost:8080/"}, "localhost"),
    ({"webhook_url": "http://0.0.0.0/"}, "non-public"),
    # Loopback spelled so that no plain address check sees it.
    ({"webhook_url": "http://127.0.0.1./"}, "non-public"),
    ({"webhook_url": "http://127.1:9/"}, "non-public"),
    ({"webhook_url": "http://[::127.0.0.1]/"}, "non-public"),
    ({"webhook_url": "http://[::ffff:0:7f00:1]/"}, "non-public"),
    ({"webhook_url": "http://[64:ff9b::7f00:1]/"}, "non-public"),
    ({"webhook_url": "http://[64:ff9b:1::a00:1]/"}, "non-public"),
    ({"webhook_url": "http://[2002:7f00:1::]/"}, "non-public"),
]


async def test_unusable_webhooks_are_refused_and_nothing_is_queued(tmp_path: Path) -> None:
    async with serve(tmp_path, webhooks_secret=new_secret()) as served:
        for extra, reason in BAD_WEBHOOKS:
            reply = await served.post(
                "/prompt", {"prompt": save_prompt(1, "x"), "extra_data": extra}
            )
            assert reply.status == 400, (extra, reply.text)
            body = reply.json
            assert body["node_errors"] == {} and body["error"]["type"] == "invalid_webhook"
            assert reason in body["error"]["message"], (extra, body)
        assert (await served.get("/api/jobs"))["pagination"]["total"] == 0


async def test_private_addresses_are_allowed_with_the_setting(tmp_path: Path) -> None:
    settings = {"webhooks_secret": new_secret(), "webhooks_allow_private": True}
    async with serve(tmp_path, **settings) as served:
        for url in ("http://127.0.0.1:9/hook", "http://localhost:9/", "http://10.1.2.3/"):
            extra = {"webhook_url": url}
            reply = await served.post(
                "/prompt", {"prompt": save_prompt(1, "x"), "extra_data": extra}
            )
            assert reply.status == 200, reply.text


async def test_prompts_own_webhooks_need_the_servers_secret(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        extra = {"webhook_url": "https://hooks.example.com/"}
        reply = await served.post("/prompt", {"prompt": save_prompt(1, "x"), "extra_data": extra})
        assert reply.status == 400 and "webhooks_secret" in reply.json["error"]["message"]


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.0.0.1."])
async def test_the_address_connected_to_is_checked_when_sending(tmp_path: Path, host: str) -> None:
    """A URL that got past the submit check (DNS changed since, or it was stored before):
    the delivery never reaches the private address."""
    secret = new_secret()
    settings = {"webhooks_secret": secret, "webhooks_retry_for": 0.0}
    async with Receiver(secret) as receiver, serve(tmp_path, **settings) as served:
        url = receiver.url.replace("127.0.0.1", host)
        queued = NewJob("sneaky", 1, False, save_prompt(1, "s"), {"webhook_url": url}, ["2"])
        await served.gateway.scheduler.submit(queued)

        async def dead() -> bool:
            return bool(await deliveries(served, "state=dead"))

        await poll(dead, timeout=20, what="the delivery dead-lettered")
        [delivery] = await deliveries(served)
        assert "public" in delivery["last_error"] and delivery["last_status"] is None
        assert receiver.received == []
        assert served.gateway.webhooks.dead_lettered == 1


async def test_a_hanging_receiver_delays_no_other_delivery(tmp_path: Path) -> None:
    secret = new_secret()
    async with Receiver(secret, mode="hang") as stuck, Receiver(secret) as fine:
        targets = (target("stuck", stuck, secret), target("fine", fine, secret))
        settings = {"webhooks": targets, "webhooks_concurrency": 4, "webhooks_timeout": 60.0}
        async with serve(tmp_path, **settings) as served:
            started = time.monotonic()
            ids = [await served.submit(save_prompt(i, f"p{i}")) for i in range(8)]
            got = await fine.wait_for(len(ids), timeout=30)
            assert time.monotonic() - started < 30  # not one 60 s timeout waited for
            assert sorted(r.prompt_id for r in got.values()) == sorted(ids)
            assert stuck.received  # it is hanging on the ones it took

            async def only_stuck_pending() -> bool:
                # A delivery is recorded a moment after its receiver has it.
                pending = await deliveries(served, "state=pending")
                return {d["target"] for d in pending} == {"stuck"}

            await poll(only_stuck_pending, timeout=10, what="the fine deliveries recorded")


async def test_failures_are_retried_then_dead_lettered_then_retried_by_id(tmp_path: Path) -> None:
    secret = new_secret()
    async with Receiver(secret, mode="fail") as receiver:
        settings = {"webhooks": (target("flaky", receiver, secret),), "webhooks_retry_for": 1.5}
        async with serve(tmp_path, **settings) as served:
            prompt_id = await served.submit(save_prompt(3, "r"))

            async def dead() -> bool:
                return bool(await deliveries(served, "state=dead"))

            await poll(dead, timeout=20, what="the delivery dead-lettered")
            [letter] = await deliveries(served, "state=dead")
            assert letter["prompt_id"] == prompt_id and letter["attempts"] >= 2
            assert letter["last_status"] == 500
            assert letter["last_error"] == "HTTP 500: receiver says no"
            assert len(receiver.received) == letter["attempts"]
            assert {r.id for r in receiver.received} == {letter["id"]}
            sender = served.gateway.webhooks
            assert (sender.failed_attempts, sender.dead_lettered, sender.sent) == (
                letter["attempts"],
                1,
                0,
            )

            receiver.mode = "ok"
            reply = await served.post(f"/api/webhooks/deliveries/{letter['id']}/retry", {})
            assert reply.status == 200 and reply.json["state"] == "pending"
            again = await served.post(f"/api/webhooks/deliveries/{letter['id']}/retry", {})
            assert again.status in (200, 409)  # 409 while pending; 200 once delivered
            missing = await served.post("/api/webhooks/deliveries/msg_nope/retry", {})
            assert missing.status == 404

            async def delivered() -> bool:
                return bool(await deliveries(served, "state=delivered"))

            await poll(delivered, timeout=20, what="the retried delivery delivered")
            assert {r.id for r in receiver.received} == {letter["id"]}
            bodies = {str(r.body) for r in receiver.received}
            assert len(bodies) == 1  # every attempt sent the same body
            detail = await served.get(f"/api/webhooks/deliveries/{letter['id']}")
            assert detail["body"] == receiver.received[0].body
            assert served.gateway.webhooks.sent == 1
            bad = await served.request("GET", "/api/webhooks/deliveries?state=lost")
            assert bad.status == 400


async def test_the_deliveries_api_is_for_admins_when_auth_is_on(tmp_path: Path) -> None:
    tokens = (AuthToken("admin-token", admin=True), AuthToken("alice-token", "alice"))
    async with serve(tmp_path, auth_tokens=tokens) as served:
        for token, status in (("alice-token", 403), ("admin-token", 200)):
            headers = {"Authorization": f"Bearer {token}"}
            for method, path in (
                ("GET", "/api/webhooks/deliveries"),
                ("POST", "/api/webhooks/deliveries/msg_x/retry"),
            ):
                reply = await served.request(method, path, headers=headers)
                assert reply.status == (404 if status == 200 and method == "POST" else status)
