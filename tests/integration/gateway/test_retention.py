"""History retention: the newest entries stay, older ones go with their jobs and files."""

from __future__ import annotations

from pathlib import Path

from tests.integration.gateway.wire import save_prompt, serve


async def test_pruning_keeps_the_newest_entries_and_deletes_the_others_files(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, local_slots=1, history_max_entries=3) as served:
        sock = await served.connect()
        ids = await served.run_in_turn(sock, (save_prompt(n, f"kept{n}") for n in range(5)))
        output = served.gateway.folders.output
        files = {n: output / f"kept{n}_00001_.png" for n in range(5)}
        assert all(path.exists() for path in files.values())

        removed = await served.gateway.prune_once()

        assert removed == 2
        assert list(await served.get("/history")) == ids[2:]
        assert [files[n].exists() for n in range(5)] == [False, False, True, True, True]
        for gone in ids[:2]:
            assert (await served.request("GET", f"/api/jobs/{gone}")).status == 404
        assert await served.gateway.prune_once() == 0  # nothing more to do
        assert list(await served.get("/history")) == ids[2:]
