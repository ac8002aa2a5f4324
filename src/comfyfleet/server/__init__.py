"""The aiohttp server: ComfyUI's routes, the jobs API and the WebSocket hub."""
