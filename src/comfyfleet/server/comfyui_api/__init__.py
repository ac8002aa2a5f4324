"""ComfyUI's own API: the queue, history, node information, the WebSocket, following a prompt."""
