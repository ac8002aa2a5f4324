"""Lanes: places a prompt can run (the built-in engine, remote ComfyUI instances)."""
