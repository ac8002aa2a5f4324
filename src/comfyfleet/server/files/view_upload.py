"""`/view`, `/upload/image` and `/upload/mask`: files in the output, input and temp folders.

Status codes and name-clash rules follow ComfyUI 0.3.64. Error replies have no body and
no Content-Type, as ComfyUI's do. Every path is checked after resolving symlinks, so a
link inside a folder never exposes, or lets an upload write to, a file outside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import mimetypes
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from PIL import Image

from comfyfleet import imaging
from comfyfleet.errors import ComfyfleetError
from comfyfleet.folders import Folders, UnsafePath, plain_name, plain_subfolder, resolve_inside
from comfyfleet.lanes.backend import FileAnswer
from comfyfleet.lanes.outputs import split_reference
from comfyfleet.server.plumbing.client_json import has_lone_surrogate, loads
from comfyfleet.server.plumbing.routing import Route

_ANNOTATIONS = ("output", "input", "temp")
# Types a browser would render or run in the server's origin: sent as downloads instead.
_FORCED_DOWNLOAD = frozenset(
    {"text/html", "text/html-sandboxed", "application/xhtml+xml", "text/javascript", "text/css"}
)
_TEXT_FIELDS = frozenset({"overwrite", "subfolder", "type", "original_ref"})
_TEXT_FIELD_LIMIT = 64 * 1024
_READ_CHUNK = 256 * 1024
# Uploaded bytes collected on the event loop before one write in a worker thread.
_FLUSH_BYTES = 1 << 20
_SPOOL_IN_MEMORY = 1 << 20
_BINARY = getattr(os, "O_BINARY", 0)
# What storing an upload raises when the name or subfolder is taken by the other kind.
_NAME_CLASHES = (IsADirectoryError, NotADirectoryError, FileExistsError)
#: Components an upload's subfolder may have: creating each missing one is a stack frame.
MAX_SUBFOLDER_DEPTH = 64


class _Reject(ComfyfleetError):
    """Answer the request with this status and an empty body."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


#: Fetches a file kept on a backend (reference mode): (backend, query) -> its answer, or
#: None when there is no such backend.
RemoteView = Callable[[str, Mapping[str, str]], Awaitable[FileAnswer | None]]
#: Brings a file missing here from elsewhere (a peer gateway) into the request's folders:
#: (request, folders, folder type, subfolder, name) -> whether it is here now.
FetchMissing = Callable[[web.Request, Folders, str, str, str], Awaitable[bool]]
#: The same, bound to one request and its folders.
_Fetch = Callable[[str, str, str], Awaitable[bool]]


def file_routes(
    folders: Folders,
    *,
    max_upload_bytes: int,
    remote: RemoteView | None = None,
    folders_for: Callable[[web.Request], Folders] | None = None,
    fetch_missing: FetchMissing | None = None,
) -> list[Route]:
    """The file routes on `folders`, or on the folders `folders_for` gives each request
    (its tenant's). A file `/view` or a mask's original names that is not there is asked
    of `fetch_missing` before the 404."""

    def folders_of(request: web.Request) -> Folders:
        return folders if folders_for is None else folders_for(request)

    def fetch_for(request: web.Request, folders: Folders) -> _Fetch | None:
        if fetch_missing is None:
            return None
        return lambda kind, subfolder, name: fetch_missing(request, folders, kind, subfolder, name)

    async def view(request: web.Request) -> web.StreamResponse:
        reference = split_reference(request.rel_url.query.get("subfolder", ""))
        if reference is not None and remote is not None:
            backend, subfolder = reference
            query = {**request.rel_url.query, "subfolder": subfolder}
            refused = _refuse_remote(query)
            if refused is not None:
                return web.Response(status=refused)
            return _passed_on(await remote(backend, query))
        chosen = folders_of(request)
        return await _view(chosen, request, fetch_for(request, chosen))

    async def upload_image(request: web.Request) -> web.StreamResponse:
        return await _upload(folders_of(request), request, max_upload_bytes, mask=False)

    async def upload_mask(request: web.Request) -> web.StreamResponse:
        chosen = folders_of(request)
        fetch = fetch_for(request, chosen)
        return await _upload(chosen, request, max_upload_bytes, mask=True, fetch=fetch)

    return [
        Route("GET", "/view", view),
        Route("POST", "/upload/image", upload_image),
        Route("POST", "/upload/mask", upload_mask),
    ]


# ---------------------------------------------------------------- paths


def _split_annotation(name: str) -> tuple[str, str | None]:
    """`x.png [output]` -> (`x.png`, `output`); names without a folder tag -> (name, None)."""
    for kind in _ANNOTATIONS:
        tag = f"[{kind}]"
        if name.endswith(tag):
            return name.removesuffix(tag).removesuffix(" "), kind
    return name, None


def _has_control(text: str) -> bool:
    # NUL breaks path calls and CR/LF would end the Content-Disposition header early.
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def _passed_on(answer: FileAnswer | None) -> web.Response:
    """A backend's answer to `/view`: its file, or its status alone (no body, no headers)."""
    if answer is None:
        return web.Response(status=404)
    if answer.status != 200:
        return web.Response(status=answer.status)
    return web.Response(body=answer.body, content_type=answer.content_type)


def _refuse_remote(query: Mapping[str, str]) -> int | None:
    """The status refusing a `/view` of a file kept on a backend, None if it may be asked
    for there: plain names only (the gateway cannot resolve paths on the backend), with
    the statuses of local files (400 for the name or the type, 403 for the subfolder)."""
    if "filename" not in query:
        return 404  # as for a local file
    name, subfolder = query["filename"], query["subfolder"]
    if _has_control(name) or _has_control(subfolder):
        return 400
    if query.get("type", "output") not in _ANNOTATIONS:  # the backend joins it to a path
        return 400
    try:
        plain_name(name)
    except UnsafePath:
        return 400
    try:
        plain_subfolder(subfolder)
    except UnsafePath:
        return 403
    return None


def _wanted(query: Mapping[str, str], *, flatten: bool = True) -> tuple[str, str, str]:
    """(folder type, subfolder, name) of the file `query` names; 400 for a bad name or type.

    `query` holds `filename` plus optional `type` and `subfolder`, as in `/view`. With
    `flatten` (as `/view` does) only the last component of `filename` is used.
    """
    name, kind = _split_annotation(query["filename"])
    if not name or name.startswith("/") or ".." in name or _has_control(name):
        raise _Reject(400)
    kind = kind or query.get("type", "output")
    if kind not in _ANNOTATIONS:
        raise _Reject(400)
    subfolder = query.get("subfolder", "")
    if _has_control(subfolder):
        raise _Reject(400)
    return kind, subfolder, os.path.basename(name) if flatten else name


def _locate(folders: Folders, query: Mapping[str, str], *, flatten: bool = True) -> tuple[str, str]:
    """The real path of the existing file `query` names (see `_wanted`), and the name to
    report for it."""
    kind, subfolder, name = _wanted(query, flatten=flatten)
    root = folders.of_type(kind)
    assert root is not None  # _wanted knows the types
    try:
        directory = resolve_inside(root, subfolder)
        path = str(resolve_inside(root, os.path.join(directory, name)))
    except UnsafePath as exc:  # a subfolder, or a symlink, that leads out of the folder
        raise _Reject(403) from exc
    if not os.path.isfile(path):
        raise _Reject(404)
    return path, name


# ---------------------------------------------------------------- /view


def _disposition(name: str) -> dict[str, str]:
    quoted = name.replace("\\", "\\\\").replace('"', '\\"')
    return {"Content-Disposition": f'filename="{quoted}"'}


def _content_type(name: str) -> str:
    guessed = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return "application/octet-stream" if guessed in _FORCED_DOWNLOAD else guessed


def _decode_image(path: str | IO[bytes], convert: Callable[[Image.Image], bytes]) -> bytes:
    """`convert` applied to the picture at `path`; 400 when it is not a readable image."""
    try:
        with Image.open(path) as picture:
            return convert(picture)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise _Reject(400) from exc


def _preview(path: str, spec: str, channel: str) -> tuple[bytes, str]:
    """`preview=webp;50` / `jpeg;90`: anything else, or an alpha channel asked for, gives WEBP."""
    parts = spec.split(";")
    fmt = parts[0] if parts[0] in ("webp", "jpeg") and "a" not in channel else "webp"
    last = parts[-1]
    quality = int(last) if last.isascii() and last.isdigit() else 90
    body = _decode_image(
        path, lambda img: imaging.encode_web_preview(img, fmt, quality, channel != "rgb")
    )
    return body, f"image/{fmt}"


def _channel_png(path: str, channel: str) -> bytes:
    return _decode_image(path, imaging.rgb_png if channel == "rgb" else imaging.alpha_png)


async def _located(
    folders: Folders, query: Mapping[str, str], fetch: _Fetch | None, *, flatten: bool = True
) -> tuple[str, str]:
    """`_locate`, with a file that is not there fetched first (when it can be)."""
    try:
        return await asyncio.to_thread(_locate, folders, query, flatten=flatten)
    except _Reject as reject:
        if reject.status != 404 or fetch is None:
            raise
        if not await fetch(*_wanted(query, flatten=flatten)):
            raise
    return await asyncio.to_thread(_locate, folders, query, flatten=flatten)


async def stored_file(
    folders: Folders, query: Mapping[str, str], fetch: _Fetch | None = None
) -> tuple[str, str] | int:
    """The real path and reported name of the file `query` names (`filename`, `type`,
    `subfolder`), fetched first when it is missing and `fetch` can; else the status
    `/view` would answer (400, 403, 404)."""
    try:
        return await _located(folders, query, fetch)
    except _Reject as reject:
        return reject.status


def content_type_of(name: str) -> str:
    """The Content-Type `/view` serves a file of this name with."""
    return _content_type(name)


async def local_file(folders: Folders, query: Mapping[str, str]) -> web.StreamResponse:
    """The file `query` names (`filename`, `type`, `subfolder`) as it is in `folders`, with
    `/view`'s checks and statuses; no preview or channel, and nothing fetched."""
    if "filename" not in query:
        return web.Response(status=404)
    try:
        path, name = await asyncio.to_thread(_locate, folders, query)
    except _Reject as reject:
        return web.Response(status=reject.status)
    headers = {**_disposition(name), "Content-Type": _content_type(name)}
    return web.FileResponse(path, headers=headers)


async def _view(
    folders: Folders, request: web.Request, fetch: _Fetch | None = None
) -> web.StreamResponse:
    query = request.rel_url.query
    if "filename" not in query:
        return web.Response(status=404)
    channel = query.get("channel", "")
    try:
        path, name = await _located(folders, query, fetch)
        if "preview" in query:
            body, ctype = await asyncio.to_thread(_preview, path, query["preview"], channel)
        elif channel in ("rgb", "a"):
            body, ctype = await asyncio.to_thread(_channel_png, path, channel), "image/png"
        else:
            # FileResponse streams from a worker thread (and handles Range and caching).
            headers = {**_disposition(name), "Content-Type": _content_type(name)}
            return web.FileResponse(path, headers=headers)
    except _Reject as reject:
        return web.Response(status=reject.status)
    return web.Response(body=body, content_type=ctype, headers=_disposition(name))


# ---------------------------------------------------------------- upload: reading the form


class _Payload:
    """Bytes to store, spooled to a temporary file, with their size and SHA-256."""

    def __init__(self) -> None:
        # Closed by close(): a payload outlives the function that fills it.
        self.file: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY)  # noqa: SIM115
        self._sha = hashlib.sha256()
        self.size = 0

    @classmethod
    def of_bytes(cls, data: bytes) -> _Payload:
        payload = cls()
        payload.write(data)
        return payload

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self._sha.update(data)
        self.size += len(data)

    def digest(self) -> bytes:
        return self._sha.digest()

    def copy_to(self, out: IO[bytes]) -> None:
        self.file.seek(0)
        shutil.copyfileobj(self.file, out, _FLUSH_BYTES)

    def close(self) -> None:
        self.file.close()


@dataclass
class _Form:
    fields: dict[str, str] = field(default_factory=dict)
    image: _Payload | None = None
    filename: str | None = None

    def close(self) -> None:
        if self.image is not None:
            self.image.close()


class _Budget:
    """Bytes a request may still send; 413 once they run out."""

    def __init__(self, limit: int) -> None:
        self.left = limit

    def take(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise _Reject(413)


async def _read_form(request: web.Request, limit: int) -> _Form:
    """The multipart form, its file part spooled through worker threads."""
    if request.content_length is not None and request.content_length > limit:
        raise _Reject(413)
    if request.content_type != "multipart/form-data":
        raise _Reject(400)
    form, budget = _Form(), _Budget(limit)
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):  # nested multipart: not a browser form
                raise _Reject(400)
            await _read_part(part, form, budget)
    except (ValueError, LookupError, RuntimeError, HttpProcessingError) as exc:
        form.close()  # malformed body, bad charset or transfer encoding
        raise _Reject(400) from exc
    except BaseException:
        form.close()
        raise
    return form


async def _read_part(part: BodyPartReader, form: _Form, budget: _Budget) -> None:
    # Like aiohttp's request.post(), the first field of a name wins.
    if part.name == "image" and part.filename is not None and form.image is None:
        form.filename = part.filename
        form.image = _Payload()
        await _stream(part, budget, form.image.write)
    elif part.name in _TEXT_FIELDS and part.filename is None and part.name not in form.fields:
        form.fields[part.name] = await _read_text(part, budget)
    else:
        await _stream(part, budget, None)


async def _stream(
    part: BodyPartReader, budget: _Budget, sink: Callable[[bytes], None] | None
) -> None:
    """Feed a part to `sink` in large blocks from a worker thread (or drain it if None)."""
    pending = bytearray()
    while chunk := await part.read_chunk(_READ_CHUNK):
        if sink is None:
            budget.take(len(chunk))
            continue
        data = part.decode(chunk)
        budget.take(max(len(chunk), len(data)))
        pending += data
        if len(pending) >= _FLUSH_BYTES:
            await asyncio.to_thread(sink, bytes(pending))
            pending.clear()
    if sink is not None and pending:
        await asyncio.to_thread(sink, bytes(pending))


async def _read_text(part: BodyPartReader, budget: _Budget) -> str:
    data = bytearray()
    while chunk := await part.read_chunk(_READ_CHUNK):
        budget.take(len(chunk))
        data += part.decode(chunk)
        if len(data) > _TEXT_FIELD_LIMIT:
            raise _Reject(400)
    return bytes(data).decode(part.get_charset(default="utf-8"))


# ---------------------------------------------------------------- upload: storing


async def _upload(
    folders: Folders, request: web.Request, limit: int, *, mask: bool, fetch: _Fetch | None = None
) -> web.StreamResponse:
    try:
        form = await _read_form(request, limit)
    except _Reject as reject:
        return web.Response(status=reject.status)
    try:
        return await _store_form(folders, form, mask=mask, fetch=fetch)
    except _Reject as reject:
        return web.Response(status=reject.status)
    finally:
        await asyncio.to_thread(form.close)


async def _store_form(
    folders: Folders, form: _Form, *, mask: bool, fetch: _Fetch | None = None
) -> web.StreamResponse:
    if form.image is None or not form.filename:
        raise _Reject(400)
    kind = form.fields.get("type") or "input"
    root = folders.of_type(kind)
    if root is None:
        raise _Reject(400)
    subfolder = form.fields.get("subfolder", "")
    overwrite = form.fields.get("overwrite") in ("true", "1")
    directory = await asyncio.to_thread(_target_dir, root, subfolder, form.filename)
    payload = form.image
    if mask:
        ref = _parse_ref(form.fields.get("original_ref"))
        original, _ = await _located(folders, ref, fetch, flatten=False)
        payload = await asyncio.to_thread(_masked_payload, original, form.image)
    try:
        name = await asyncio.to_thread(_save, directory, form.filename, payload, overwrite)
    except _NAME_CLASHES as exc:  # a folder where a file goes, or the reverse
        raise _Reject(400) from exc
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:  # a name past the filesystem's limit: 400
            raise
        raise _Reject(400) from exc
    finally:
        if payload is not form.image:
            await asyncio.to_thread(payload.close)
    return web.json_response({"name": name, "subfolder": subfolder, "type": kind})


def _target_dir(root: Path, subfolder: str, filename: str) -> str:
    """The real directory an upload goes to; 400 for names or subfolders that leave `root`.

    A `..` component is refused even where it would stay inside (`a/../b`): the rule is
    then one a client (and docs/openapi.json) can state without resolving paths.
    """
    bad_name = filename in (".", "..") or "/" in filename or "\\" in filename
    parts = subfolder.split("/")
    bad_subfolder = ".." in parts or len(parts) > MAX_SUBFOLDER_DEPTH or _has_control(subfolder)
    # A lone surrogate (from bytes that are not UTF-8, or a decoded escape) is no file name's.
    not_unicode = has_lone_surrogate(filename) or has_lone_surrogate(subfolder)
    if bad_name or bad_subfolder or not_unicode or _has_control(filename):
        raise _Reject(400)
    try:
        return str(resolve_inside(root, os.path.normpath(subfolder)))
    except UnsafePath as exc:
        raise _Reject(400) from exc


def _candidates(filename: str) -> Iterator[str]:
    """`x.png`, then `x (1).png`, `x (2).png`, ..."""
    yield filename
    stem, ext = os.path.splitext(filename)
    number = 1
    while True:
        yield f"{stem} ({number}){ext}"
        number += 1


def _save(directory: str, filename: str, payload: _Payload, overwrite: bool) -> str:
    """Store `payload` in `directory` under `filename` or the first free variant; its name.

    A name already holding identical bytes is reused without writing. New names are
    claimed with O_CREAT|O_EXCL, so concurrent uploads never replace each other's file,
    and the content is renamed over the claim so readers never see a partial file.
    """
    os.makedirs(directory, exist_ok=True)
    staged: str | None = None
    try:
        if overwrite:
            staged = _stage(directory, payload)
            os.replace(staged, os.path.join(directory, filename))
            staged = None
            return filename
        for candidate in _candidates(filename):
            path = os.path.join(directory, candidate)
            if not os.path.lexists(path):
                staged = staged or _stage(directory, payload)
                if _claim(path):
                    os.replace(staged, path)
                    staged = None
                    return candidate
            if _same_content(path, payload):
                return candidate
        raise AssertionError("unreachable: the candidate names never run out")
    finally:
        if staged is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged)


def _stage(directory: str, payload: _Payload) -> str:
    """Write `payload` to a hidden file in `directory` (same filesystem, so renames are atomic)."""
    path = os.path.join(directory, f".upload-{secrets.token_hex(8)}.part")
    # Created like open() would, so the stored file gets the usual umask-based mode.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _BINARY, 0o666)
    try:
        with os.fdopen(fd, "wb") as out:
            payload.copy_to(out)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    return path


def _claim(path: str) -> bool:
    """Create `path` if no one has; False when it already exists (even as a dangling link)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _BINARY, 0o666)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _same_content(path: str, payload: _Payload) -> bool:
    """True if `path` is a regular file (not a symlink) holding exactly the payload's bytes."""
    flags = os.O_RDONLY | _BINARY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # a symlink, a socket, unreadable: never taken as the same file
        return False
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size != payload.size:
        os.close(fd)  # e.g. a directory, which os.fdopen would refuse with an error
        return False
    with os.fdopen(fd, "rb") as file:
        sha = hashlib.sha256()
        while block := file.read(_FLUSH_BYTES):
            sha.update(block)
    return sha.digest() == payload.digest()


# ---------------------------------------------------------------- /upload/mask


def _parse_ref(text: str | None) -> dict[str, str]:
    """`original_ref`: JSON naming the image the mask applies to, as `/view` parameters."""
    try:
        ref: Any = loads(text) if text is not None else None
    except ValueError as exc:  # RefusedJson included
        raise _Reject(400) from exc
    if not isinstance(ref, dict) or not isinstance(ref.get("filename"), str):
        raise _Reject(400)
    query = {"filename": ref["filename"], "type": ref.get("type", "output")}
    if ref.get("subfolder"):
        query["subfolder"] = ref["subfolder"]
    if not all(isinstance(value, str) for value in query.values()):
        raise _Reject(400)
    return query


def _masked_payload(path: str, mask: _Payload) -> _Payload:
    """The original image at `path` with the uploaded mask's alpha, as the bytes to store."""
    mask.file.seek(0)

    def apply(mask_picture: Image.Image) -> bytes:
        return _decode_image(path, lambda original: imaging.masked_png(original, mask_picture))

    return _Payload.of_bytes(_decode_image(mask.file, apply))
