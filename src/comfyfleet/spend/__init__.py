"""Paid-job budgets: prices, per-tenant and per-prompt budgets, and what a prompt costs."""
