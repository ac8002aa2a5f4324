"""For operators: the fleet's backends, probes, metrics, webhook deliveries."""
