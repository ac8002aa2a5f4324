"""Events to clients: the WebSocket hub, per-client routing, the durable event log, the relay."""
