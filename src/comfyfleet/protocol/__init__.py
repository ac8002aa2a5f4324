"""ComfyUI wire shapes: prompt format, error objects, event payloads. Pure, no I/O."""
