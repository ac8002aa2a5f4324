"""API Settings: where provider nodes send jobs, and which key they use."""

from __future__ import annotations

from typing import Any

from comfyfleet.engine.services import service
from comfyfleet.fanout.request import ApiConfig
from comfyfleet.fanout.secrets import REFERENCE_HELP, SERVICE, parse_reference
from comfyfleet.nodes.providers.common import API_CONFIG

#: `comfyfleet emulate-provider` listens here by default: workflows run without a key.
DEFAULT_BASE_URL = "http://127.0.0.1:8299"


class APISettings:
    # Inputs that name keys: a key typed into one of these, or into a node linked into
    # one, is taken out of the prompt before it is stored (see fanout.secrets).
    SECRET_INPUTS = ("api_key",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "base_url": (
                    "STRING",
                    {
                        "default": DEFAULT_BASE_URL,
                        "tooltip": "The provider's API root, a relay speaking its protocol, or "
                        "the local emulator.",
                    },
                ),
                "api_key": ("STRING", {"default": "", "tooltip": REFERENCE_HELP}),
            },
            "optional": {
                "max_concurrency": (
                    "INT",
                    {"default": 0, "min": 0, "max": 1000, "tooltip": "0: the pool's limit"},
                ),
                "requests_per_second": (
                    "FLOAT",
                    {"default": 0.0, "min": 0.0, "max": 1000.0, "step": 0.1},
                ),
                "poll_interval": ("FLOAT", {"default": 1.0, "min": 0.05, "max": 60.0}),
                "timeout": ("FLOAT", {"default": 900.0, "min": 1.0, "max": 86400.0}),
            },
        }

    RETURN_TYPES = (API_CONFIG,)
    RETURN_NAMES = ("api_config",)
    FUNCTION = "configure"
    CATEGORY = "api"
    DESCRIPTION = "Base URL and key reference for provider nodes."

    @classmethod
    def VALIDATE_INPUTS(cls, base_url: str) -> bool | str:
        if not isinstance(base_url, str) or not base_url.strip().startswith(
            ("http://", "https://")
        ):
            return "base_url must start with http:// or https://"
        return True

    @classmethod
    def static_outputs(cls, **inputs: Any) -> tuple[ApiConfig] | None:
        """Its output from its widgets alone, before any run (a prompt's cost dry run tells
        requests apart by it): base URL and key reference are all a request's hash reads.
        None for a typed key, which becomes a marker only when the prompt is stored."""
        api_key = str(inputs.get("api_key", ""))
        if parse_reference(api_key)[0] == "typed":
            return None
        base_url = str(inputs.get("base_url", DEFAULT_BASE_URL))
        return (ApiConfig(base_url.strip(), api_key.strip()),)

    def configure(
        self,
        base_url: str,
        api_key: str,
        max_concurrency: int = 0,
        requests_per_second: float = 0.0,
        poll_interval: float = 1.0,
        timeout: float = 900.0,
    ) -> tuple[ApiConfig]:
        vault = service(SERVICE)
        reference = api_key
        if parse_reference(api_key)[0] == "typed":
            # Not scrubbed on the way in (a direct engine call): never let it travel on.
            reference = vault.remember(api_key)
        vault.resolve(reference)  # fail here, clearly, when the key is not available
        config = ApiConfig(
            base_url.strip(),
            reference.strip(),
            max_concurrency=max_concurrency,
            requests_per_second=requests_per_second,
            poll_interval=poll_interval,
            timeout=timeout,
        )
        return (config,)
