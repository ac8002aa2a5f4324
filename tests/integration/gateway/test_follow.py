"""Following any prompt by id: WebSocket subscriptions and Server-Sent Events, against a
real gateway (in this process, or a `comfyfleet serve` child killed with SIGKILL)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from comfyfleet.protocol import frames
from comfyfleet.server.comfyui_api import follow
from tests.integration.gateway.processes import submit
from tests.integration.gateway.sse import SseEvent, SseReader, assert_strictly_increasing
from tests.integration.gateway.test_auth import tenants
from tests.integration.gateway.wire import (
    Received,
    Served,
    Socket,
    binary_prompt,
    client_frames,
    poll,
    serve,
    sleep_prompt,
)
from tests.servers import ServerProcess

pytestmark = pytest.mark.timeout(120)


def stream_of(sock: Socket, prompt_id: str) -> list[tuple[str, Any]]:
    """The JSON frames of one prompt a socket got (the subscription's own acks aside)."""
    return [
        (f.type, f.data)
        for f in sock.frames
        if f.prompt_id == prompt_id
        and f.type not in ("binary", "subscribed", "unsubscribed", "subscribe_error")
    ]


def progress_count(prompt_id: str, at_least: int) -> Any:
    def enough(frames: list[Received]) -> bool:
        seen = sum(1 for f in frames if f.type == "progress" and f.prompt_id == prompt_id)
        return seen >= at_least

    return enough


async def subscribe(sock: Socket, prompt_id: str) -> None:
    after = len(sock.frames)
    await sock.send_json({"type": "subscribe", "data": {"prompt_id": prompt_id}})
    await sock.wait_for(
        lambda f: f.type in ("subscribed", "subscribe_error") and f.data["prompt_id"] == prompt_id,
        after=after,
        what=f"the answer to subscribe {prompt_id}",
    )


async def refusal(sock: Socket, message: Any) -> dict[str, Any]:
    """The `subscribe_error` a message gets."""
    after = len(sock.frames)
    await sock.send_json(message)
    index = await sock.wait_for(
        lambda f: f.type in ("subscribe_error", "subscribed"), after=after, what="an answer"
    )
    assert sock.frames[index].type == "subscribe_error", sock.frames[index]
    data: dict[str, Any] = sock.frames[index].data
    return data


async def queue_behind_a_long_prompt(served: Served) -> None:
    """Take the only slot for good: what is submitted next stays queued."""
    owner = await served.connect()
    blocker = await served.submit(sleep_prompt(120), owner.client_id)
    await owner.progress(blocker, "2")


async def sse(served: Served, prompt_id: str, query: str = "", **headers: str) -> list[SseEvent]:
    async with served.session.get(
        f"{served.url}/api/jobs/{prompt_id}/events{query}", headers=headers
    ) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/event-stream")
        return await SseReader(response).until_done()


# -- WebSocket subscriptions ------------------------------------------------------------


async def test_a_late_subscriber_gets_every_frame_in_order(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        owner = await served.connect()
        prompt_id = await served.submit(sleep_prompt(1.0), owner.client_id)
        await owner.wait_until(progress_count(prompt_id, 5), what="the prompt well under way")

        late = await served.connect()
        await subscribe(late, prompt_id)
        await late.done(prompt_id)
        await owner.done(prompt_id)

        expected = stream_of(owner, prompt_id)
        assert expected[0][0] == "execution_start" and len(expected) > 20
        assert stream_of(late, prompt_id) == expected
        # Its own events only, and nothing after the done signal.
        assert [f for f in late.frames if f.prompt_id not in (None, prompt_id)] == []
        assert late.frames[-1].is_done(prompt_id)


async def test_subscribers_joining_at_every_moment_see_no_gap_and_no_repeat(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        owner = await served.connect()
        # TestSleep reports every 10 ms: commits land while each subscriber replays.
        prompt_id = await served.submit(sleep_prompt(1.5, node="TestSleep"), owner.client_id)
        subscribers = []
        for step in range(1, 9):
            await owner.wait_until(progress_count(prompt_id, 12 * step), what=f"step {step}")
            subscriber = await served.connect()
            await subscribe(subscriber, prompt_id)
            subscribers.append(subscriber)
        await owner.done(prompt_id)

        expected = stream_of(owner, prompt_id)
        for subscriber in subscribers:
            await subscriber.done(prompt_id)
            assert stream_of(subscriber, prompt_id) == expected
        logged = await sse(served, prompt_id)
        assert [(e.event, e.data) for e in logged] == expected


async def test_a_prompt_without_client_id_is_followed_by_id(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        bystander = await served.connect()
        prompt_id = await served.submit(sleep_prompt(0.3))  # no client_id: no one gets it
        follower = await served.connect()
        await subscribe(follower, prompt_id)
        await follower.done(prompt_id)
        types = [t for t, _ in stream_of(follower, prompt_id)]
        assert types[0] == "execution_start" and "execution_success" in types
        assert stream_of(bystander, prompt_id) == []


async def test_the_owner_subscribing_to_its_prompt_gets_the_replay_then_each_frame_once(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        owner = await served.connect()
        prompt_id = await served.submit(sleep_prompt(0.8), owner.client_id)
        await owner.wait_until(progress_count(prompt_id, 3), what="the prompt under way")
        await subscribe(owner, prompt_id)
        acked = next(i for i, f in enumerate(owner.frames) if f.type == "subscribed")
        await owner.done(prompt_id)
        logged = [(e.event, e.data) for e in await sse(served, prompt_id)]
        # Its frames came straight until it subscribed; then the replay and what followed
        # come from the log alone, none of them also straight.
        direct = [(f.type, f.data) for f in owner.frames[:acked] if f.prompt_id == prompt_id]
        followed = [(f.type, f.data) for f in owner.frames[acked + 1 :] if f.prompt_id == prompt_id]
        assert followed == logged
        assert direct == logged[: len(direct)]


async def test_followers_get_previews_and_progress_text_once_in_the_owners_order(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        blocker = await served.connect()
        first = await served.submit(sleep_prompt(0.5), blocker.client_id)
        own = {m: await served.connect("owner", preview_metadata=m) for m in (False, True)}
        prompt_id = await served.submit(binary_prompt(), "owner")  # queued behind `first`
        # Sockets of the owner itself that subscribe: its frames come from the log alone.
        subscribed = {m: await served.connect("owner", preview_metadata=m) for m in (False, True)}
        for sock in subscribed.values():
            await subscribe(sock, prompt_id)
        await blocker.done(first)
        for sock in [*own.values(), *subscribed.values()]:
            await sock.done(prompt_id)
        # And others following it once it is over: the replay.
        late = {m: await served.connect(preview_metadata=m) for m in (False, True)}
        for sock in late.values():
            await subscribe(sock, prompt_id)
            await sock.done(prompt_id)

        for metadata in (False, True):
            expected = client_frames(own[metadata])
            codes = [f.data.event_code for f in expected if f.type == "binary"]
            assert sorted(codes) == sorted([3] + [4 if metadata else 1] * 3), codes
            assert client_frames(subscribed[metadata]) == expected  # each once
            assert client_frames(late[metadata]) == expected
        # SSE: the binary frames as `binary` events, code 4 for previews, base64.
        logged = await sse(served, prompt_id)
        assert_strictly_increasing(logged)
        as_frames = [
            Received("binary", frames.decode(base64.b64decode(e.data["frame"])))
            if e.event == "binary"
            else Received(e.event, e.data)
            for e in logged
        ]
        assert as_frames == client_frames(own[True])
        assert {e.data["event"] for e in logged if e.event == "binary"} == {3, 4}


async def test_unsubscribe_stops_the_frames(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        owner = await served.connect()
        prompt_id = await served.submit(sleep_prompt(1.0), owner.client_id)
        follower = await served.connect()
        await subscribe(follower, prompt_id)
        await follower.wait_until(progress_count(prompt_id, 3), what="frames of the prompt")
        await follower.send_json({"type": "unsubscribe", "data": {"prompt_id": prompt_id}})
        acked = await follower.wait_for(lambda f: f.type == "unsubscribed", what="the ack")
        await owner.done(prompt_id)
        await served.get("/prompt")  # a round trip: anything still coming would be queued
        assert [f for f in follower.frames[acked + 1 :] if f.prompt_id == prompt_id] == []
        assert len(stream_of(follower, prompt_id)) < len(stream_of(owner, prompt_id))


async def test_bad_subscriptions_are_refused_with_a_reason(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        await queue_behind_a_long_prompt(served)
        sock = await served.connect()
        for message in (
            {"type": "subscribe"},
            {"type": "subscribe", "data": {"prompt_id": 7}},
            {"type": "subscribe", "data": {"prompt_id": ""}},
            {"type": "subscribe", "data": {"prompt_id": "x" * 201}},
            {"type": "unsubscribe", "data": []},
        ):
            refused = await refusal(sock, message)
            assert refused["prompt_id"] is None and "prompt_id" in refused["message"]
        unknown = await refusal(sock, {"type": "subscribe", "data": {"prompt_id": "nope"}})
        assert unknown == {"prompt_id": "nope", "message": "no such prompt"}

        ids = [await served.submit(sleep_prompt(0.1, n)) for n in range(follow.MAX_SUBSCRIPTIONS)]
        for prompt_id in ids:
            await subscribe(sock, prompt_id)
        extra = await served.submit(sleep_prompt(0.1))
        too_many = await refusal(sock, {"type": "subscribe", "data": {"prompt_id": extra}})
        assert too_many["message"] == f"at most {follow.MAX_SUBSCRIPTIONS} subscriptions per socket"
        # Subscribing again to a followed prompt is acknowledged, and replays nothing twice.
        await subscribe(sock, ids[0])
        assert sum(1 for f in sock.frames if f.type == "subscribed") == len(ids) + 1
        # The socket still reads and answers after all that.
        await sock.send_json({"type": "unsubscribe", "data": {"prompt_id": ids[0]}})
        await sock.wait_for(lambda f: f.type == "unsubscribed", what="the ack")
        await subscribe(sock, extra)
        assert [f.type for f in sock.frames if f.data.get("prompt_id") == extra] == [
            "subscribe_error",
            "subscribed",
        ]


async def test_followers_see_only_their_tenants_prompts(tmp_path: Path) -> None:
    async with tenants(tmp_path) as clients:
        prompt_id = await clients.alice.submit(sleep_prompt(0.3))  # no client_id
        alice = await clients.alice.connect()
        bob = await clients.bob.connect()
        await subscribe(alice, prompt_id)
        others = await refusal(bob, {"type": "subscribe", "data": {"prompt_id": prompt_id}})
        unknown = await refusal(bob, {"type": "subscribe", "data": {"prompt_id": "unknown"}})
        assert others["message"] == unknown["message"] == "no such prompt"
        await alice.done(prompt_id)
        assert stream_of(bob, prompt_id) == []

        theirs = await clients.bob.request("GET", f"/api/jobs/{prompt_id}/events")
        nobodys = await clients.bob.request("GET", "/api/jobs/unknown/events")
        assert theirs.status == nobodys.status == 404
        assert theirs.json == nobodys.json
        assert (await sse(clients.alice, prompt_id))[-1].done
        anonymous = await clients.anonymous.request("GET", f"/api/jobs/{prompt_id}/events")
        assert anonymous.status == 401


# -- Server-Sent Events ----------------------------------------------------------------------


async def test_sse_resumes_exactly_after_the_last_event_id(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        owner = await served.connect()
        prompt_id = await served.submit(sleep_prompt(0.3), owner.client_id)
        everything = await sse(served, prompt_id)
        assert_strictly_increasing(everything)
        assert [(e.event, e.data) for e in everything] == stream_of(owner, prompt_id)
        stored = await served.gateway.store.prompt_events(prompt_id, limit=10_000)
        assert [e.id for e in stored] == [e.id for e in everything]

        middle = everything[len(everything) // 2].id
        assert await sse(served, prompt_id, **{"Last-Event-ID": str(middle)}) == [
            e for e in everything if e.id > middle
        ]
        by_query = await sse(served, prompt_id, f"?last_event_id={middle}")
        assert by_query == [e for e in everything if e.id > middle]
        # After the done signal: 204, which tells an EventSource to stop reconnecting.
        finished = await served.request(
            "GET",
            f"/api/jobs/{prompt_id}/events",
            headers={"Last-Event-ID": str(everything[-1].id)},
        )
        assert finished.status == 204


@pytest.mark.parametrize("bad", ["abc", "-1", "1.5", "9" * 30, "١٢"])
async def test_sse_refuses_a_bad_last_event_id(tmp_path: Path, bad: str) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        prompt_id = await served.submit(sleep_prompt(0.1))
        reply = await served.request(
            "GET", f"/api/jobs/{prompt_id}/events", headers={"Last-Event-ID": bad}
        )
        assert reply.status == 400
        assert reply.json["error"]["type"] == "invalid_last_event_id"
        assert reply.json["node_errors"] == {}
        unknown = await served.request("GET", "/api/jobs/unknown/events")
        assert unknown.status == 404 and unknown.json["error"]["type"] == "not_found"


async def test_a_quiet_sse_stream_is_kept_alive_and_ends_when_its_prompt_is_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(follow, "KEEP_ALIVE", 0.05)
    async with serve(tmp_path, local_slots=1) as served:
        await queue_behind_a_long_prompt(served)
        prompt_id = await served.submit(sleep_prompt(0.1))
        async with served.session.get(f"{served.url}/api/jobs/{prompt_id}/events") as response:
            reader = SseReader(response)
            events = reader.events()
            waiting = asyncio.ensure_future(anext(events))
            await poll(lambda: _true(reader.comments >= 2), what="keep-alive comments")
            assert not waiting.done()
            cancelled = await served.post(f"/api/jobs/{prompt_id}/cancel", {})
            assert cancelled.json == {"cancelled": [prompt_id]}
            done = await asyncio.wait_for(waiting, 30)
            assert done.done and done.data == {"node": None, "prompt_id": prompt_id}
            assert [e async for e in events] == []  # and the stream ends


async def _true(value: bool) -> bool:
    return value


async def test_sse_resumes_after_the_gateway_is_killed(tmp_path: Path) -> None:
    """SIGKILL while a prompt streams; the restarted gateway runs it again and the client,
    resuming from its Last-Event-ID, gets the rest: no id twice, none of the log missed."""
    data = tmp_path / "data"
    first = await asyncio.to_thread(ServerProcess(data, "--local-slots", "1").start)
    try:
        prompt_id = await asyncio.to_thread(submit, first, sleep_prompt(3.0))
        seen: list[SseEvent] = []
        async with aiohttp.ClientSession() as http:
            url = f"/api/jobs/{prompt_id}/events"
            async with http.get(first.url + url) as response:
                try:
                    async for event in SseReader(response).events():
                        seen.append(event)
                        if sum(e.event == "progress" for e in seen) == 10:
                            first.kill()  # the connection is still open
                except aiohttp.ClientError:
                    pass  # cut by the kill
            assert sum(e.event == "progress" for e in seen) >= 10
            assert not any(e.done for e in seen)

            second = ServerProcess(data, "--local-slots", "1", port=first.port)
            await asyncio.to_thread(second.start)
            try:
                headers = {"Last-Event-ID": str(seen[-1].id)}
                async with http.get(second.url + url, headers=headers) as response:
                    assert response.status == 200
                    rest = await SseReader(response).until_done()
                async with http.get(second.url + url) as response:
                    everything = await SseReader(response).until_done()
            finally:
                second.kill()
    finally:
        first.kill()
    received = seen + rest
    assert_strictly_increasing(received)
    assert received == everything  # what the store holds, all of it, each once
    kinds = [e.event for e in everything]
    assert kinds.count("execution_start") == 2  # the second run, after the restart
    assert kinds.count("execution_success") == 1 and kinds[-2] == "execution_success"


# -- retention --------------------------------------------------------------------------------


async def test_events_are_kept_while_running_and_pruned_after_their_retention(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, local_slots=2) as served:
        store, log = served.gateway.store, served.gateway.events
        assert log is not None and log.retention == 3600  # the default: an hour
        owner = await served.connect()
        ended = await served.submit(sleep_prompt(0.05), owner.client_id)
        await owner.done(ended)
        running = await served.submit(sleep_prompt(30), owner.client_id)
        await owner.progress(running, "2")
        await log.flush()
        await served.gateway.prune_once()
        assert len(await store.prompt_events(ended)) > 3  # ended just now

        log.retention = 0  # everything that ended is now past its retention
        await served.gateway.prune_once()
        assert await store.prompt_events(ended) == []
        assert len(await store.prompt_events(running)) > 3  # its job still runs
        gone = await served.request("GET", f"/api/jobs/{ended}/events")
        assert gone.status == 200  # the job is still listed: its stream is just the end
        await served.post(f"/api/jobs/{running}/cancel", {})


async def test_the_retention_loop_prunes_events_without_history_limits(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        owner = await served.connect()
        prompt_id = await served.submit(sleep_prompt(0.05), owner.client_id)
        await owner.done(prompt_id)
    async with serve(tmp_path, local_slots=1, events_retention=0.001) as served:
        store = served.gateway.store

        async def pruned() -> bool:
            return await store.prompt_events(prompt_id) == []

        await poll(pruned, what="the retention loop to prune the ended prompt's events")


async def test_with_the_log_off_following_is_refused(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1, events_retention=0) as served:
        owner = await served.connect()
        prompt_id = await served.submit(sleep_prompt(0.05), owner.client_id)
        await owner.done(prompt_id)
        refused = await refusal(owner, {"type": "subscribe", "data": {"prompt_id": prompt_id}})
        assert refused["message"] == "the event log is off (events_retention = 0)"
        reply = await served.request("GET", f"/api/jobs/{prompt_id}/events")
        assert reply.status == 404 and "event log is off" in reply.json["error"]["message"]
        assert await served.gateway.store.prompt_events(prompt_id) == []


async def test_following_works_the_same_over_postgres(
    tmp_path: Path, postgres_database: str
) -> None:
    async with serve(tmp_path, local_slots=1, store=postgres_database) as served:
        owner = await served.connect()
        prompt_id = await served.submit(sleep_prompt(0.6), owner.client_id)
        await owner.wait_until(progress_count(prompt_id, 3), what="the prompt under way")
        late = await served.connect()
        await subscribe(late, prompt_id)
        await late.done(prompt_id)
        await owner.done(prompt_id)
        assert stream_of(late, prompt_id) == stream_of(owner, prompt_id)
        everything = await sse(served, prompt_id)
        assert_strictly_increasing(everything)
        assert [(e.event, e.data) for e in everything] == stream_of(owner, prompt_id)
        middle = everything[len(everything) // 2].id
        resumed = await sse(served, prompt_id, **{"Last-Event-ID": str(middle)})
        assert resumed == [e for e in everything if e.id > middle]


async def test_a_prompt_run_by_one_gateway_is_followed_through_another(
    tmp_path: Path, postgres_database: str
) -> None:
    async with (
        serve(tmp_path / "a", local_slots=1, store=postgres_database) as running,
        serve(tmp_path / "b", local_slots=0, store=postgres_database) as other,
    ):
        owner = await running.connect()
        prompt_id = await running.submit(sleep_prompt(1.0), owner.client_id)
        await owner.wait_until(progress_count(prompt_id, 3), what="the prompt under way")
        elsewhere = await other.connect()
        await subscribe(elsewhere, prompt_id)
        through_other = await sse(other, prompt_id)
        await elsewhere.done(prompt_id)
        await owner.done(prompt_id)
        assert [(e.event, e.data) for e in through_other] == stream_of(owner, prompt_id)
        assert stream_of(elsewhere, prompt_id) == stream_of(owner, prompt_id)
        assert through_other == await sse(running, prompt_id)
