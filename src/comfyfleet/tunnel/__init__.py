"""Byte streams carried over one WebSocket, so a gateway reaches a worker's backend
through a connection the worker opened (workers behind NAT or a firewall).

The gateway listens on a loopback port per worker; each connection made to it (by the
worker's lane: HTTP requests, the backend's WebSocket) becomes a stream the worker
connects on to its own backend on loopback. Only the gateway opens streams, and the
worker only ever connects them to the one backend it was started with.
"""
