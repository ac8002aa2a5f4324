"""User data: the editor's saved workflows, subgraphs, templates and user.css, per tenant.

Routes and answers follow ComfyUI 0.3.64's user manager in single-user mode, the user
being the tenant the request acts for (its token's; `default` without authentication).
Files live in the tenant's `user/` folder (`TenantFolders.user_dir`). Every name a client
gives is resolved with `resolve_inside`: `..`, absolute names and symlinks never lead out
of that folder. A file is written to a hidden temporary file and renamed into place, so a
reader never sees half of it and a crash leaves the old one.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import mimetypes
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib import parse

from aiohttp import web

from comfyfleet.folders import UnsafePath, resolve_inside
from comfyfleet.server.plumbing.routing import Route

#: Entries one listing returns at most (a folder may hold anything a client wrote).
MAX_LISTED = 20_000
#: Types a browser would run in the server's origin: a user file is never served as one.
_SCRIPTABLE = ("text/html", "application/xhtml+xml", "text/javascript", "application/javascript")

UserDirOf = Callable[[web.Request], Path]


def text_answer(status: int, text: str) -> web.Response:
    """ComfyUI's plain-text refusals (`text/plain; charset=utf-8`)."""
    return web.Response(status=status, text=text)


def client_name(raw: str) -> str:
    """A name from the URL: aiohttp decoded it once; ComfyUI decodes a name that still
    holds `%` once more (clients encode `workflows/x.json` as `workflows%2Fx.json`)."""
    return parse.unquote(raw) if "%" in raw else raw


def locate(root: Path, name: str, *, follow_last: bool = True) -> Path | None:
    """`name` inside `root` (symlinks resolved), None if it leads out or is unusable."""
    if not name or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return None
    try:
        return resolve_inside(root, name, follow_last=follow_last)
    except UnsafePath:
        return None


def file_info(path: Path, relative_to: Path) -> dict[str, Any]:
    info = path.stat()
    return {
        "path": _relative(path, relative_to),
        "size": info.st_size,
        "modified": info.st_mtime,
        "created": info.st_ctime,
    }


def _relative(path: Path | str, root: Path | str) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


# ---------------------------------------------------------------- writing


def write_file(path: Path, body: bytes, *, overwrite: bool) -> bool:
    """Store `body` at `path` (its folders created); False when it exists and may not be
    replaced. The bytes go to a hidden file in the same folder, renamed over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not overwrite:
        try:  # claim the name: two writers of one new name never both win
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            return False
    staged = path.parent / f".{path.name}.{secrets.token_hex(6)}.part"
    try:
        with open(staged, "xb") as out:
            out.write(body)
        os.replace(staged, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
    return True


# ---------------------------------------------------------------- listing


def _visible(name: str) -> bool:
    return not name.startswith(".")  # as ComfyUI's glob: hidden files are not listed


def _files_under(root: Path, directory: Path, recurse: bool) -> list[Path]:
    """Files in `directory` (and below, with `recurse`), hidden ones and links that lead
    out of `root` left out; at most MAX_LISTED, sorted."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = sorted(d for d in dirnames if _visible(d)) if recurse else []
        for name in sorted(filter(_visible, filenames)):
            path = Path(dirpath, name)
            if locate(root, _relative(path, root)) is not None and os.path.isfile(path):
                found.append(path)
            if len(found) >= MAX_LISTED:
                return found
    return found


def list_dir(root: Path, directory: Path, query: dict[str, str]) -> list[Any]:
    recurse = query.get("recurse", "").lower() == "true"
    full_info = query.get("full_info", "").lower() == "true"
    split = query.get("split", "").lower() == "true"
    out: list[Any] = []
    for path in _files_under(root, directory, recurse):
        if full_info:
            out.append(file_info(path, directory))
            continue
        relative = _relative(path, directory)
        out.append([relative, *relative.split("/")] if split else relative)
    return out


def list_v2(base: Path, target: Path) -> list[dict[str, Any]]:
    """`/v2/userdata`: every file and folder under `target`, paths from `base`,
    folders first, then by name."""
    results: list[dict[str, Any]] = []
    for dirpath, dirnames, filenames in os.walk(target):
        dirnames.sort()
        for name in dirnames:
            path = os.path.join(dirpath, name)
            results.append({"name": name, "path": _relative(path, base), "type": "directory"})
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            entry: dict[str, Any] = {"name": name, "path": _relative(path, base), "type": "file"}
            with contextlib.suppress(OSError):
                info = os.stat(path)
                entry["size"], entry["modified"] = info.st_size, info.st_mtime
            results.append(entry)
        if len(results) >= MAX_LISTED:
            break
    results = results[:MAX_LISTED]
    results.sort(key=lambda e: (e["type"] != "directory", e["name"].lower()))
    return results


# ---------------------------------------------------------------- the routes' work
# Each runs in a worker thread (paths are resolved on disk) and returns the answer.

Answer = web.Response


def _json(value: Any) -> web.Response:
    return web.json_response(value)


def _too_long(exc: OSError) -> Answer | None:
    """The answer to a name longer than the filesystem takes (a client's mistake)."""
    if exc.errno == errno.ENAMETOOLONG:
        return text_answer(400, "File name too long")
    return None


def _real(root: Path) -> Path:
    return Path(os.path.realpath(root))


def do_list(root: Path, query: dict[str, str]) -> Answer:
    directory = query.get("dir", "")
    if not directory:
        return text_answer(400, "Directory not provided")
    root = _real(root)
    path = locate(root, client_name(directory))
    if path is None:
        return text_answer(403, "Invalid directory")
    if not os.path.isdir(path):
        return text_answer(404, "Directory not found")
    return _json(list_dir(root, path, query))


def do_list_v2(root: Path, requested: str) -> Answer:
    root = _real(root)
    target = locate(root, client_name(requested) if requested else ".")
    if target is None:
        return text_answer(400, "Invalid path requested")
    if not os.path.exists(target):
        if target == root:
            return _json([])  # a new tenant: nothing saved yet
        return text_answer(404, "Requested path not found")
    if not os.path.isdir(target):
        return text_answer(400, "Requested path is not a directory")
    return _json(list_v2(root, target))


def do_get(root: Path, name: str) -> web.StreamResponse:
    path = locate(root, client_name(name))
    if path is None:
        return web.Response(status=403)
    if not os.path.isfile(path):
        return web.Response(status=404)
    kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    if kind in _SCRIPTABLE:
        kind = "application/octet-stream"
    return web.FileResponse(path, headers={"Content-Type": kind})


def do_post(root: Path, name: str, body: bytes, query: dict[str, str]) -> Answer:
    root = _real(root)
    path = locate(root, client_name(name))
    if path is None:
        return web.Response(status=403)
    try:
        if not write_file(path, body, overwrite=query.get("overwrite", "true") != "false"):
            return text_answer(409, "File already exists")
        return _json(_answer_for(path, root, query))
    except OSError as exc:  # a folder where the file goes, a name the filesystem refuses
        return _too_long(exc) or web.Response(
            status=400,
            reason='Invalid filename. Please avoid special characters like :\\/*?"<>|',
        )


def do_delete(root: Path, name: str) -> Answer:
    """Delete the file (a link itself, not what it names)."""
    path = locate(root, client_name(name), follow_last=False)
    if path is None:
        return web.Response(status=403)
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            return web.Response(status=404)  # not a file
        os.unlink(path)
    except (FileNotFoundError, NotADirectoryError):  # a file named as a folder
        return web.Response(status=404)
    except OSError as exc:
        answer = _too_long(exc)
        if answer is None:
            raise
        return answer
    return web.Response(status=204)


def do_move(root: Path, name: str, dest_name: str, query: dict[str, str]) -> Answer:
    root = _real(root)
    source = locate(root, client_name(name), follow_last=False)
    if source is None:
        return web.Response(status=403)
    if not os.path.lexists(source):
        return web.Response(status=404)
    dest = locate(root, client_name(dest_name), follow_last=False)
    if dest is None:
        return web.Response(status=403)
    if query.get("overwrite", "true") == "false" and os.path.lexists(dest):
        return text_answer(409, "File already exists")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, dest)
        return _json(_answer_for(dest, root, query))
    except OSError as exc:
        return _too_long(exc) or web.Response(status=400)


def _answer_for(path: Path, root: Path, query: dict[str, str]) -> Any:
    full_info = query.get("full_info", "false").lower() == "true"
    return file_info(path, root) if full_info else _relative(path, root)


# ---------------------------------------------------------------- routes


def userdata_routes(user_dir_of: UserDirOf) -> list[Route]:
    """`/users`, `/userdata` and `/v2/userdata` on the user folder of each request's tenant."""

    async def get_users(request: web.Request) -> web.StreamResponse:
        migrated = await asyncio.to_thread(os.path.isdir, user_dir_of(request))
        return web.json_response({"storage": "server", "migrated": migrated})

    async def post_users(request: web.Request) -> web.StreamResponse:
        # ComfyUI's multi-user profiles: here each token is one user, its tenant.
        return web.json_response(
            {"error": "Users are the tenants of authentication tokens"}, status=400
        )

    async def list_userdata(request: web.Request) -> web.StreamResponse:
        return await asyncio.to_thread(do_list, user_dir_of(request), dict(request.query))

    async def list_userdata_v2(request: web.Request) -> web.StreamResponse:
        path = request.query.get("path", "")
        return await asyncio.to_thread(do_list_v2, user_dir_of(request), path)

    async def get_file(request: web.Request) -> web.StreamResponse:
        return await asyncio.to_thread(do_get, user_dir_of(request), request.match_info["file"])

    async def post_file(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        name, query = request.match_info["file"], dict(request.query)
        return await asyncio.to_thread(do_post, user_dir_of(request), name, body, query)

    async def delete_file(request: web.Request) -> web.StreamResponse:
        name = request.match_info["file"]
        return await asyncio.to_thread(do_delete, user_dir_of(request), name)

    async def move_file(request: web.Request) -> web.StreamResponse:
        names = request.match_info["file"], request.match_info["dest"]
        query = dict(request.query)
        return await asyncio.to_thread(do_move, user_dir_of(request), *names, query)

    return [
        Route("GET", "/users", get_users),
        Route("POST", "/users", post_users),
        Route("GET", "/userdata", list_userdata),
        Route("GET", "/v2/userdata", list_userdata_v2),
        Route("GET", "/userdata/{file}", get_file),
        Route("POST", "/userdata/{file}", post_file),
        Route("DELETE", "/userdata/{file}", delete_file),
        Route("POST", "/userdata/{file}/move/{dest}", move_file),
    ]
