"""Across a SIGKILL of `comfyfleet serve` between job ends and their deliveries, every
end reaches the receiver, each once after dropping repeated webhook-ids."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.integration.gateway.wire import save_prompt
from tests.integration.webhooks.receiver import Receiver, new_secret
from tests.servers import ServerProcess


def config_file(folder: Path, url: str, secret: str) -> Path:
    (folder / "hook.secret").write_text(secret + "\n")
    path = folder / "comfyfleet.toml"
    path.write_text(
        "webhooks_timeout = 1\n"
        "webhooks_concurrency = 4\n"  # one attempt at a time to the one target
        "[[webhooks]]\n"
        'name = "app"\n'
        f'url = "{url}"\n'
        'secret_file = "hook.secret"\n'
    )
    return path


async def test_every_end_is_delivered_once_after_a_sigkill(tmp_path: Path) -> None:
    secret = new_secret()
    async with Receiver(secret, mode="hang") as receiver:
        config = config_file(tmp_path, receiver.url, secret)
        data = tmp_path / "data"
        # The server processes are driven from threads: the receiver answers on this loop.
        first = await asyncio.to_thread(ServerProcess(data, "--config", str(config)).start)
        try:
            ids = [
                (await asyncio.to_thread(first.post, "/prompt", {"prompt": save_prompt(i, "k")}))[
                    "prompt_id"
                ]
                for i in range(6)
            ]
            await receiver.wait_for(1)  # the first is being sent, the others wait
        finally:
            first.kill()  # ends recorded, deliveries not: one sent and never answered
        assert len(receiver.unique()) < len(ids)
        receiver.mode = "ok"
        second = await asyncio.to_thread(ServerProcess(data, "--config", str(config)).start)
        try:
            # The dead process's lease on the one it was sending ends after 4 x 1 + 5 s.
            got = await receiver.wait_for(len(ids), timeout=60)
        finally:
            second.kill()
        assert sorted(r.prompt_id for r in got.values()) == sorted(ids)
        assert all(r.body["type"] == "job.succeeded" for r in got.values())
        assert len(receiver.received) > len(got)  # at least once: a repeat, dropped by id
        assert receiver.unverified == 0
