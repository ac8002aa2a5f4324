"""Comfy API v2's uploaded assets: upload with blake3 de-duplication, mint from a hash,
probe by hash, get, content (range-aware) and delete; and `core/ASSET` references in a
submitted workflow, resolved to the names ComfyUI's nodes read.

Bytes are kept once per tenant, under their blake3 hash, in the tenant's input folder
(`assets/<hex><ext>`): an upload of bytes the tenant has already gets a new asset over
the same blob (`created_new: false`). Records are the store's (see
comfyfleet.domain.assets), so every gateway of a shared store knows them; bytes another
gateway took are fetched from it when asked for, and kept (comfyfleet.peers checks them
against the hash).
"""

from __future__ import annotations

import asyncio
import contextlib
import mimetypes
import os
import posixpath
import re
import uuid
from pathlib import Path
from typing import IO, Any

import blake3
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from comfyfleet.domain.assets import BLOB_FOLDER, AssetRecord
from comfyfleet.folders import Folders, UnsafePath
from comfyfleet.peers import FileRef
from comfyfleet.server.access.auth import tenant_name, visible
from comfyfleet.server.comfy_api_v2 import shapes
from comfyfleet.server.comfy_api_v2.errors import PREFIX, V2Error, invalid_request, not_found
from comfyfleet.server.gateway import GATEWAY

#: `blake3:` and 64 lowercase hex digits.
HASH = re.compile(r"blake3:[0-9a-f]{64}")
#: The longest file name, media type and form field taken.
MAX_NAME = 255
MAX_FIELD = 1024
#: Bytes of form fields not kept (tags) an upload may carry.
MAX_SKIPPED = 1 << 20
#: Bytes read from an upload at a time (hashed and written in a worker thread).
CHUNK = 1 << 20
_EXTENSION = re.compile(r"\.[A-Za-z0-9]{1,10}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def folders_of(request: web.Request) -> Folders:
    return request.app[GATEWAY].tenants.of(tenant_name(request))


def asset_body(
    request: web.Request, record: AssetRecord, *, created_new: bool | None = None
) -> dict[str, Any]:
    base = f"{request.scheme}://{request.host}"
    body: dict[str, Any] = {
        "id": record.id,
        "hash": record.hash,
        "size_bytes": record.size,
        "content_type": record.content_type,
        "file_path": record.file_path,
        "created_at": shapes.iso(record.created_at),
        "url": f"{base}{PREFIX}/assets/{record.id}/content",
        "url_expires_at": shapes.NO_DEADLINE.isoformat(),
        "expires_at": None,
    }
    if created_new is not None:
        body["created_new"] = created_new
    return body


def blob_path(folders: Folders, record: AssetRecord) -> Path:
    return folders.resolve_inside("input", record.blob)


async def local_blob(request: web.Request, record: AssetRecord) -> Path | None:
    """Where the asset's bytes are here, fetched from another gateway of the store when
    this one lacks them (it took the upload); None when no gateway has them."""
    folders = folders_of(request)
    try:
        path = blob_path(folders, record)
    except UnsafePath:
        return None
    if await asyncio.to_thread(path.is_file):
        return path
    subfolder, name = posixpath.split(record.blob)
    ref = FileRef(tenant_name(request), "input", subfolder, name)
    return path if await request.app[GATEWAY].peers.fetch(ref, folders) else None


async def uploaded(request: web.Request, asset_id: str) -> AssetRecord | None:
    """The caller's uploaded asset of this id (None: unknown, or another tenant's)."""
    if len(asset_id) > 64:
        return None
    return await request.app[GATEWAY].store.asset(tenant_name(request), asset_id)


# -- upload -------------------------------------------------------------------------------


class _Spool:
    """An upload's bytes, written to a file beside where its blob goes and hashed."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f".upload-{uuid.uuid4().hex}.part"
        self.file: IO[bytes] = open(self.path, "wb")  # noqa: SIM115 (closed in finish/drop)
        self.hasher = blake3.blake3()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.hasher.update(chunk)
        self.file.write(chunk)

    def finish(self) -> str:
        self.file.close()
        return "blake3:" + self.hasher.hexdigest()

    def drop(self) -> None:
        self.file.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


async def _text(part: BodyPartReader) -> str:
    raw = b""
    while chunk := await part.read_chunk(MAX_FIELD + 1 - len(raw) or 1):
        raw += chunk
        if len(raw) > MAX_FIELD:
            raise invalid_request(f"form field {str(part.name)[:40]!r} is over {MAX_FIELD} bytes")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise invalid_request(f"form field {part.name!r} is not UTF-8 text") from None


async def _spool(part: BodyPartReader, spool: _Spool, limit: int) -> None:
    while chunk := await part.read_chunk(CHUNK):
        spool.size += len(chunk)
        if spool.size > limit:
            raise V2Error(413, "too_large", f"The upload is larger than {limit} bytes")
        await asyncio.to_thread(spool.write, chunk)


def _name(value: str | None, what: str) -> str:
    if not value or len(value) > MAX_NAME or _CONTROL.search(value):
        raise invalid_request(f"{what} must be 1 to {MAX_NAME} characters, no control characters")
    return value


def _blob_name(digest: str, file_path: str, content_type: str) -> str:
    ext = os.path.splitext(file_path)[1]
    if not _EXTENSION.fullmatch(ext):
        ext = mimetypes.guess_extension(content_type) or ""
    return f"{BLOB_FOLDER}/{digest.removeprefix('blake3:')}{ext.lower()}"


async def upload(request: web.Request) -> web.Response:
    """`POST /api/v2/assets` (multipart: content_type, file_path, expected_hash?, tags*,
    then the file): 201 and the asset."""
    gw = request.app[GATEWAY]
    if not request.content_type.startswith("multipart/"):
        raise invalid_request("send multipart/form-data")
    try:
        reader = await request.multipart()
    except (ValueError, AssertionError):
        raise invalid_request("the multipart body cannot be read") from None
    folders = folders_of(request)
    fields: dict[str, str] = {}
    spool: _Spool | None = None
    skipped = 0
    try:
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise invalid_request("nested multipart bodies are not taken")
            if part.filename is not None or part.name == "file":
                if spool is not None:
                    raise invalid_request("send one file")
                spool = await asyncio.to_thread(_Spool, Path(folders.input) / BLOB_FOLDER)
                await _spool(part, spool, gw.config.max_upload_bytes)
            elif part.name and part.name != "tags" and len(fields) < 16:
                fields[part.name] = await _text(part)
            else:  # tags (not kept), and fields past the sixteenth: counted, not kept
                while chunk := await part.read_chunk(MAX_FIELD):
                    skipped += len(chunk)
                    if skipped > MAX_SKIPPED:
                        raise V2Error(413, "too_large", "The form's other fields are too large")
        if spool is None:
            raise invalid_request("the form holds no file")
        digest = await asyncio.to_thread(spool.finish)
        record = await _keep(request, spool, digest, fields)
    except (ValueError, AssertionError, RuntimeError, HttpProcessingError) as exc:  # bad form
        if spool is not None:
            await asyncio.to_thread(spool.drop)
        raise invalid_request("the multipart body cannot be read") from exc
    except BaseException:
        if spool is not None:
            await asyncio.to_thread(spool.drop)
        raise
    created = record[1]
    return web.json_response(asset_body(request, record[0], created_new=created), status=201)


async def _keep(
    request: web.Request, spool: _Spool, digest: str, fields: dict[str, str]
) -> tuple[AssetRecord, bool]:
    """The new asset over the spooled bytes: their blob kept (or the tenant's copy of
    them reused)."""
    store = request.app[GATEWAY].store
    tenant = tenant_name(request)
    file_path = _name(fields.get("file_path"), "file_path")
    content_type = _name(fields.get("content_type"), "content_type")
    expected = fields.get("expected_hash")
    if expected is not None and expected != digest:
        raise V2Error(409, "hash_mismatch", "The bytes do not have expected_hash", {"hash": digest})
    first = await store.asset_by_hash(tenant, digest)
    folders = folders_of(request)
    blob = first.blob if first is not None else _blob_name(digest, file_path, content_type)
    target = folders.resolve_inside("input", blob)
    created = await asyncio.to_thread(_place, spool, target)
    record = AssetRecord(
        str(uuid.uuid4()), tenant, digest, spool.size, content_type, file_path, blob
    )
    return await store.add_asset(record), created


def _place(spool: _Spool, target: Path) -> bool:
    """Move the spooled bytes to `target` unless they are there already (a blob is
    named by its hash: the same name holds the same bytes); whether they were moved."""
    if target.is_file():
        spool.drop()
        return False
    os.replace(spool.path, target)
    return True


# -- the other routes ---------------------------------------------------------------------


async def _json_object(request: web.Request) -> dict[str, Any]:
    from comfyfleet.server.plumbing.client_json import RefusedJson, loads

    raw = await request.read()
    if len(raw) > 64 * 1024:
        raise V2Error(413, "too_large", "The request body is larger than 64 KiB")
    try:
        body = loads(raw) if raw.strip() else None
    except RefusedJson as refused:
        raise invalid_request(f"The body is not usable JSON: {refused.message}") from None
    if not isinstance(body, dict):
        raise invalid_request("The body must be a JSON object")
    return body


async def from_hash(request: web.Request) -> web.Response:
    """`POST /api/v2/assets/from-hash {hash, file_path?}`: a new asset over bytes the
    tenant already uploaded; 404 `blob_not_found` when it has none."""
    body = await _json_object(request)
    digest = body.get("hash")
    if not isinstance(digest, str) or not HASH.fullmatch(digest):
        raise invalid_request("hash must be blake3: and 64 lowercase hex digits")
    store = request.app[GATEWAY].store
    tenant = tenant_name(request)
    first = await store.asset_by_hash(tenant, digest)
    if first is None or await local_blob(request, first) is None:
        raise V2Error(404, "blob_not_found", "No bytes with this hash were uploaded here")
    name = body.get("file_path", first.file_path)
    record = AssetRecord(
        str(uuid.uuid4()),
        tenant,
        digest,
        first.size,
        first.content_type,
        _name(name if isinstance(name, str) else None, "file_path"),
        first.blob,
    )
    saved = await store.add_asset(record)
    return web.json_response(asset_body(request, saved, created_new=False), status=201)


async def by_hash(request: web.Request) -> web.Response:
    """`HEAD /api/v2/assets/by-hash/{hash}`: 200 when the tenant has those bytes, else 404."""
    digest = request.match_info["hash"]
    if not HASH.fullmatch(digest):
        return web.Response(status=404)
    first = await request.app[GATEWAY].store.asset_by_hash(tenant_name(request), digest)
    if first is None:
        return web.Response(status=404)
    # Fetched when another gateway holds them: the answer is what the next call finds.
    there = await local_blob(request, first) is not None
    return web.Response(status=200 if there else 404)


async def delete(request: web.Request) -> web.Response:
    """`DELETE /api/v2/assets/{id}`: the record goes; the bytes stay while another asset
    of the tenant names them."""
    gw = request.app[GATEWAY]
    tenant = tenant_name(request)
    record = await uploaded(request, request.match_info["asset_id"])
    if record is None:
        raise not_found("asset")
    await gw.store.delete_asset(tenant, record.id)
    if await gw.store.asset_by_hash(tenant, record.hash) is None:
        with contextlib.suppress(OSError, UnsafePath):
            await asyncio.to_thread(blob_path(folders_of(request), record).unlink)
    return web.Response(status=204)


# -- core/ASSET references ----------------------------------------------------------------


async def resolve_references(request: web.Request, workflow: dict[str, Any]) -> dict[str, Any]:
    """`workflow` with each `core/ASSET` reference replaced by the name a node reads
    (a file of the tenant's input folder, or an output as `name [output]`); 422
    `missing_asset` naming those that are not the caller's."""
    missing: list[str] = []
    resolved: dict[str, Any] = {}
    for node_id, node in workflow.items():
        inputs = node.get("inputs") if isinstance(node, dict) else None
        if not isinstance(inputs, dict):
            resolved[node_id] = node
            continue
        new_inputs = {}
        for name, value in inputs.items():
            if isinstance(value, dict) and value.get("__type") == "core/ASSET":
                found = await _reference(request, value.get("info"))
                if found is None:
                    info = value.get("info")
                    missing.append(str(info.get("id") if isinstance(info, dict) else None)[:100])
                new_inputs[name] = found if found is not None else value
            else:
                new_inputs[name] = value
        resolved[node_id] = {**node, "inputs": new_inputs}
    if missing:
        raise V2Error(
            422,
            "missing_asset",
            f"core/ASSET references not found: {', '.join(missing[:10])}",
            {"missing_ids": missing[:100]},
        )
    return resolved


async def _reference(request: web.Request, info: Any) -> str | None:
    if not isinstance(info, dict):
        return None
    asset_id = info.get("id")
    if isinstance(asset_id, str):
        record = await uploaded(request, asset_id)
        if record is not None:
            return record.blob
        output = shapes.parse_output_id(asset_id)
        if output is not None:
            job = await request.app[GATEWAY].store.get(output.prompt_id)
            if job is None or not visible(request, job.tenant):
                return None
            name = f"{output.subfolder}/{output.filename}" if output.subfolder else output.filename
            return f"{name} [{output.type}]"
        return None
    digest = info.get("hash")
    if isinstance(digest, str) and HASH.fullmatch(digest):
        record = await request.app[GATEWAY].store.asset_by_hash(tenant_name(request), digest)
        return None if record is None else record.blob
    return None
