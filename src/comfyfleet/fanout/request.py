"""What a paid job asks a provider for, and the hash that recognises the same ask again."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from comfyfleet.provider_http.redact import Redactor
from comfyfleet.spend.prices import PaidJob


@dataclass(frozen=True)
class ApiConfig:
    """An API settings node's output: where to send jobs and which key to use.

    Only a reference to the key travels between nodes (and into the journal);
    it is resolved when a request is sent.
    """

    base_url: str
    key_ref: str = ""
    max_concurrency: int = 0  # per endpoint and key; 0: only the pool limits
    requests_per_second: float = 0.0  # job-creating requests; 0: no limit
    poll_interval: float = 1.0
    timeout: float = 900.0  # seconds to wait for one job's result

    def __repr__(self) -> str:
        return f"ApiConfig({Redactor().url(self.base_url)!r}, key={self.key_ref or 'none'!r})"

    def identity(self) -> dict[str, Any]:
        """What makes two configs reach the same account (limits and timing do not)."""
        return {"base_url": self.base_url.rstrip("/"), "key": self.key_ref}

    def resume_fields(self) -> dict[str, Any]:
        """Enough to poll a job again after a restart; the key stays a reference."""
        return {
            "base_url": self.base_url,
            "key_ref": self.key_ref,
            "poll_interval": self.poll_interval,
            "timeout": self.timeout,
        }

    @classmethod
    def from_resume(cls, resume: dict[str, Any]) -> ApiConfig:
        return cls(
            base_url=str(resume.get("base_url", "")),
            key_ref=str(resume.get("key_ref", "")),
            poll_interval=float(resume.get("poll_interval", 1.0)),
            timeout=float(resume.get("timeout", 900.0)),
        )


@dataclass(frozen=True, eq=False)
class RemoteRequest:
    """One paid job: `provider` names the driver, `operation` the model or endpoint.

    `body` is the JSON the provider receives; `files` are multipart uploads. The
    seed takes part in the hash even when the provider has no seed parameter:
    it is how a user asks for a new job with otherwise equal inputs.
    """

    provider: str
    operation: str
    api: ApiConfig
    body: dict[str, Any]
    files: tuple[tuple[str, bytes], ...] = ()
    kind: str = "image"
    skip_error: bool = False
    seed: int | None = None
    node_class: str = ""
    #: (width, height) of the image asked for, when the request says; not part of the
    #: hash (the body is). Lets the image's memory be made ready while the job runs.
    result_size: tuple[int, int] | None = None

    @functools.cached_property
    def request_hash(self) -> str:
        return _digest(self)

    def paid_job(self) -> PaidJob:
        """What prices this job: the body's model (else the operation, BFL's model) and, for
        a video, its seconds."""
        model = self.body.get("model")
        seconds = self.body.get("seconds")
        units = float(seconds) if self.kind == "video" and seconds is not None else 1.0
        return PaidJob(self.provider, model if isinstance(model, str) else self.operation, units)

    def __repr__(self) -> str:
        return f"RemoteRequest({self.provider}/{self.operation}, {self.request_hash[:12]})"


def _digest(request: RemoteRequest) -> str:
    canonical = {
        "provider": request.provider,
        "operation": request.operation,
        "api": request.api.identity(),
        "body": request.body,
        "files": [[name, hashlib.sha256(data).hexdigest()] for name, data in request.files],
        "kind": request.kind,
        "seed": request.seed,
    }
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), default=_bytes_digest)
    return hashlib.sha256(text.encode()).hexdigest()


def _bytes_digest(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return "sha256:" + hashlib.sha256(value).hexdigest()
    raise TypeError(f"{type(value).__name__} cannot be part of a request")
