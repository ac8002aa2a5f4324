"""Prometheus metrics of a gateway (`GET /metrics`).

Metrics depend on the rest of the process, never the reverse: the server that composes
the process makes a `GatewayMetrics` and serves its route; other parts only keep plain
counters (the hub's dropped sockets, the fan-out service's ends, the webhook sender's
counts, the stores' commit times) that the collector reads at scrape time.
"""

from comfyfleet.server.admin.metrics.exporter import GatewayMetrics

__all__ = ["GatewayMetrics"]
