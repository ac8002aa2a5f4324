"""Fan-out of paid API jobs: shared pools, task handles, collection, the journal, keys.

Provider and fan-out nodes reach all of it through the engine service "fanout"
(`FanoutService`); the key vault is also published as "secrets".
"""

from comfyfleet.fanout.collect import FAILURE_MODES, CollectFailed, collect
from comfyfleet.fanout.journal import MemoryJournal
from comfyfleet.fanout.request import ApiConfig, RemoteRequest
from comfyfleet.fanout.secrets import KeyUnavailable, SecretVault, scrub_new_job
from comfyfleet.fanout.service import IMAGE, SERVICE, VIDEO, FanoutService
from comfyfleet.fanout.settings import FanoutSettings, PoolSize
from comfyfleet.fanout.task import Task, TaskState

__all__ = [
    "FAILURE_MODES",
    "IMAGE",
    "SERVICE",
    "VIDEO",
    "ApiConfig",
    "CollectFailed",
    "FanoutService",
    "FanoutSettings",
    "KeyUnavailable",
    "MemoryJournal",
    "PoolSize",
    "RemoteRequest",
    "SecretVault",
    "Task",
    "TaskState",
    "collect",
    "scrub_new_job",
]
