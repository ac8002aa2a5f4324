"""Queue management and the jobs API: what gets deleted or cancelled, and how jobs are listed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.gateway.wire import (
    Served,
    Socket,
    poll,
    save_prompt,
    serve,
    sleep_prompt,
)
from tests.servers import start_in_process


async def running_and_pending(served: Served, sock: Socket) -> tuple[str, str]:
    """On one slot: a 30 s Sleep running (seen reporting progress) and a prompt behind it."""
    running = await served.submit(sleep_prompt(30, 1), sock.client_id)
    await sock.progress(running, "2")
    pending = await served.submit(save_prompt(2, "behind"), sock.client_id)
    return running, pending


async def test_queue_delete_removes_pending_prompts_only(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        sock = await served.connect()
        running = await served.submit(sleep_prompt(1.0, 1), sock.client_id)
        await sock.progress(running, "2")
        pending = await served.submit(save_prompt(2, "deleted"), sock.client_id)

        reply = await served.post("/queue", {"delete": [running, pending]})
        assert (reply.status, reply.content_type, reply.text) == (200, None, "")
        queue = await served.get("/queue")
        assert [item[1] for item in queue["queue_running"]] == [running]
        assert queue["queue_pending"] == []

        await sock.done(running)
        assert "execution_success" in sock.json_types(running)
        later = await served.submit(save_prompt(3, "later"), sock.client_id)
        await sock.done(later)  # the queue moved past the deleted prompt: it never ran
        assert sock.of_prompt(pending) == []
        assert await served.history_entry(pending) == {}
        assert (await served.job(pending))["status"] == "cancelled"
        assert not list(served.gateway.folders.output.glob("deleted_*"))


async def test_queue_clear_cancels_every_pending_prompt(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        sock = await served.connect()
        running, pending = await running_and_pending(served, sock)
        other = await served.submit(save_prompt(3, "other"), sock.client_id)
        assert (await served.post("/queue", {"clear": True})).status == 200
        assert (await served.get("/queue"))["queue_pending"] == []
        assert [(await served.job(p))["status"] for p in (running, pending, other)] == [
            "in_progress",
            "cancelled",
            "cancelled",
        ]


async def test_cancel_ends_pending_and_running_jobs(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        sock = await served.connect()
        running, pending = await running_and_pending(served, sock)

        reply = await served.post(f"/api/jobs/{pending}/cancel", None)
        assert (reply.status, reply.json) == (200, {"cancelled": [pending]})
        reply = await served.post(f"/api/jobs/{running}/cancel", None)
        assert (reply.status, reply.json) == (200, {"cancelled": [running]})
        await sock.done(running)  # the 30 s prompt ends now, with its done signal

        for prompt_id in (running, pending):
            assert (await served.job(prompt_id))["status"] == "cancelled", prompt_id
        # The pending one never ran: no history, as a prompt deleted from ComfyUI's queue.
        assert (await served.job(pending))["messages"] == []
        assert await served.history_entry(pending) == {}
        # The running one was stopped mid-run: the entry ComfyUI makes for an
        # interrupted prompt (checked against a recorded one in
        # tests/conformance/test_proxy_paths.py).
        entry = await served.history_entry(running)
        assert entry["status"]["status_str"] == "error" and not entry["status"]["completed"]
        assert entry["status"]["messages"][-1][0] == "execution_interrupted"
        assert sock.of_prompt(pending) == []
        assert (await served.get("/prompt"))["exec_info"]["queue_remaining"] == 0

        # Finished jobs are not cancelled again; unknown ones are 404.
        reply = await served.post(f"/api/jobs/{running}/cancel", None)
        assert (reply.status, reply.json) == (200, {"cancelled": []})
        reply = await served.post("/api/jobs/no-such-job/cancel", None)
        assert reply.status == 404


async def test_cancel_many_by_id(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        sock = await served.connect()
        running, pending = await running_and_pending(served, sock)
        reply = await served.post("/api/jobs/cancel", {"job_ids": [pending, "unknown", running]})
        assert reply.status == 200
        assert sorted(reply.json["cancelled"]) == sorted([pending, running])
        await sock.done(running)
        reply = await served.post("/api/jobs/cancel", {"job_ids": "not a list"})
        assert reply.status == 400


async def jobs(served: Served, query: str) -> dict[str, Any]:
    body: dict[str, Any] = await served.get(f"/api/jobs{query}")
    return body


async def test_jobs_api_filters_sorts_and_pages(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        sock = await served.connect()
        completed = await served.run_in_turn(sock, (save_prompt(c, f"job{c}") for c in range(3)))
        failing = {
            "1": {"class_type": "Fail", "inputs": {"message": "on purpose"}},
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
        }
        failed = await served.submit(failing, sock.client_id)
        await sock.done(failed)
        running, pending = await running_and_pending(served, sock)
        created = [*completed, failed, running, pending]

        everything = await jobs(served, "")
        assert [j["id"] for j in everything["jobs"]] == created[::-1]  # newest first
        assert everything["pagination"] == {
            "offset": 0,
            "limit": 100,
            "total": 6,
            "has_more": False,
        }
        oldest_first = await jobs(served, "?sort_order=asc")
        assert [j["id"] for j in oldest_first["jobs"]] == created

        by_status = {
            "completed": completed,
            "failed": [failed],
            "in_progress": [running],
            "pending": [pending],
            "pending,in_progress": [running, pending],
        }
        for status, expected in by_status.items():
            page = await jobs(served, f"?status={status}&sort_order=asc")
            assert [j["id"] for j in page["jobs"]] == expected, status
            assert page["pagination"]["total"] == len(expected), status
        assert (await jobs(served, "?status=failed"))["jobs"][0]["execution_error"][
            "exception_message"
        ] == "on purpose\n"

        page = await jobs(served, "?limit=2&offset=1")
        assert [j["id"] for j in page["jobs"]] == created[::-1][1:3]
        assert page["pagination"] == {"offset": 1, "limit": 2, "total": 6, "has_more": True}
        page = await jobs(served, "?limit=2&offset=5")
        assert [j["id"] for j in page["jobs"]] == created[:1]
        assert page["pagination"] == {"offset": 5, "limit": 2, "total": 6, "has_more": False}
        page = await jobs(served, "?status=completed&limit=1&offset=1&sort_order=asc")
        assert [j["id"] for j in page["jobs"]] == completed[1:2]
        assert page["pagination"]["has_more"] is True

        summary = everything["jobs"][-1]
        assert summary["status"] == "completed" and summary["attempt"] == 1
        assert summary["client_id"] == sock.client_id and summary["lane"] == "local"
        for bad in ("?status=bogus", "?sort_order=sideways", "?limit=0", "?offset=-1", "?limit=x"):
            reply = await served.request("GET", f"/api/jobs{bad}")
            assert reply.status == 400, bad
            assert set(reply.json["error"]) >= {"type", "message"}, bad


async def test_job_details_and_unknown_jobs(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        sock = await served.connect()
        prompt = save_prompt(7, "detail")
        prompt_id = await served.submit(prompt, sock.client_id)
        await sock.done(prompt_id)
        job = await served.job(prompt_id)
        history = await served.history_entry(prompt_id)
        assert job["prompt"] == prompt and job["outputs"] == history["outputs"]
        assert job["messages"] == history["status"]["messages"]
        assert job["outputs_to_execute"] == ["2"]
        assert job["create_time"] <= job["execution_start_time"] <= job["execution_end_time"]

        reply = await served.request("GET", "/api/jobs/no-such-job")
        assert (reply.status, reply.content_type) == (404, "application/json; charset=utf-8")
        assert reply.json["error"]["type"] == "not_found"


async def test_jobs_carry_the_output_counts_and_preview_the_editor_shows(tmp_path: Path) -> None:
    """Frontend 1.58's queue and assets panels read ComfyUI's job fields: without
    `outputs_count` it drops the whole list."""
    async with serve(tmp_path, local_slots=1) as served:
        sock = await served.connect()
        [done] = await served.run_in_turn(sock, [save_prompt(7, "counted")])
        workflow = {"workflow": {"id": "wf-1", "nodes": []}}
        extra = {"extra_pnginfo": workflow}
        waiting = await served.submit(sleep_prompt(30), sock.client_id, extra_data=extra)
        listed = {j["id"]: j for j in (await jobs(served, ""))["jobs"]}
        finished = listed[done]
        assert finished["outputs_count"] == 1
        assert finished["previewable_outputs_count"] == 1
        preview = finished["preview_output"]
        assert preview["nodeId"] == "2" and preview["mediaType"] == "images"
        assert preview["filename"].startswith("counted") and preview["type"] == "output"
        assert finished["priority"] == finished["number"]
        assert listed[waiting]["outputs_count"] == 0 and listed[waiting]["preview_output"] is None
        assert listed[waiting]["workflow_id"] == "wf-1"
        assert (await served.get(f"/api/jobs/{done}"))["outputs_count"] == 1

        # Interrupted while running: cancelled, with no error (its interrupted payload
        # is none, and the editor would drop the whole list over it).
        await served.post(f"/api/jobs/{waiting}/cancel", None)
        await sock.done(waiting)
        cancelled = (await jobs(served, "?status=cancelled"))["jobs"]
        assert [(j["id"], j["execution_error"]) for j in cancelled] == [(waiting, None)]


async def test_a_job_failed_outside_any_node_lists_its_node_fields_as_strings(
    tmp_path: Path,
) -> None:
    """A job whose only backend is lost past its attempts fails with no node at fault.
    The jobs API gives its node fields as strings, empty ones, as the newer editor parses
    them (a null drops its whole list); history keeps ComfyUI's event as it was sent."""
    backend, _ = await start_in_process(tmp_path / "backend", local_slots=1, shutdown_grace=0.2)
    url = f"http://127.0.0.1:{backend.port}"
    try:
        async with serve(
            tmp_path / "gateway", local_slots=0, max_attempts=1, backends=({"url": url},)
        ) as served:

            async def backend_up() -> bool:
                listed = await served.get("/api/fleet/backends")
                return [b["state"] for b in listed["backends"]] == ["up"]

            await poll(backend_up, what="the backend up")
            job_id = await served.submit(sleep_prompt(30))

            async def status_is(wanted: str) -> bool:
                return str((await served.job(job_id))["status"]) == wanted

            await poll(lambda: status_is("in_progress"), what="the run on the backend")
            await backend.close()
            await poll(lambda: status_is("failed"), what="the failure")

            listed = await served.get("/api/jobs?status=completed,failed,cancelled")
            error = listed["jobs"][0]["execution_error"]
            assert (error["node_id"], error["node_type"]) == ("", "")
            assert error["exception_type"] == "comfyfleet.LaneFailure"
            assert error["exception_message"].startswith("the job failed on its lane 1 times")
            # Every field the editor's schema requires of it, of the type it requires.
            for field in ("node_id", "node_type", "exception_message", "exception_type"):
                assert isinstance(error[field], str), field
            assert error["traceback"] == []
            assert (await served.job(job_id))["execution_error"] == error
            sent = (await served.history_entry(job_id))["status"]["messages"][-1]
            assert sent[0] == "execution_error"
            assert sent[1] == {**error, "node_id": None, "node_type": None}
    finally:
        await backend.close()
