"""Pool sizes for fan-out jobs: defaults, overridden by COMFYFLEET_* variables at start-up."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PoolSize:
    concurrency: int  # jobs running at once
    pending: int  # jobs admitted and waiting for a running slot

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.pending < 0:
            raise ValueError(
                f"a pool needs concurrency >= 1 and pending >= 0, not "
                f"{self.concurrency} and {self.pending}"
            )


@dataclass(frozen=True)
class FanoutSettings:
    """Both pools are shared by every prompt of the process; the node's output type picks one."""

    image: PoolSize = field(default_factory=lambda: PoolSize(30, 30))
    video: PoolSize = field(default_factory=lambda: PoolSize(10, 10))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> FanoutSettings:
        """The defaults, with `COMFYFLEET_{IMAGE,VIDEO}_{CONCURRENCY,PENDING}` applied."""
        default = cls()
        return cls(
            image=_pool(env, "IMAGE", default.image),
            video=_pool(env, "VIDEO", default.video),
        )


def _pool(env: Mapping[str, str], kind: str, default: PoolSize) -> PoolSize:
    def number(name: str, fallback: int) -> int:
        raw = env.get(f"COMFYFLEET_{kind}_{name}", "").strip()
        if not raw:
            return fallback
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"COMFYFLEET_{kind}_{name} must be an integer, not {raw!r}") from None

    return PoolSize(number("CONCURRENCY", default.concurrency), number("PENDING", default.pending))
