"""The gateway's side of workers: their connections, tunnels and lanes."""
