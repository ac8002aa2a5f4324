"""comfyfleet: a ComfyUI-compatible server that runs many prompts at once, durably."""

__version__ = "0.1.0"
