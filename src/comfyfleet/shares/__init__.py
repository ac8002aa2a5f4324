"""Tenants' shares of the fleet: weights, caps and priority classes (see policy.py), and
the order in which backlogged tenants' jobs are tried (see picking.py)."""
