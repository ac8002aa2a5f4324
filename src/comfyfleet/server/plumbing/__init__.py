"""What every route shares: route tables, JSON from clients, middlewares."""
