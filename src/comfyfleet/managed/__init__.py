"""Managed backends: ComfyUI processes (or any server of ComfyUI's API) that the gateway
starts, watches, restarts and recycles itself, one or more per GPU.

`spec` reads the `[[comfyui]]` tables and plans the instances, `process` starts and
stops a child that never outlives the gateway, `instance` keeps one running,
`manager` holds them all, and `pack` gives real ComfyUI instances the companion pack.
"""
