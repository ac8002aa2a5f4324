"""Comfy API v2 (the contract of Comfy Cloud and its SDK) over the gateway's own queue."""
