"""Durable jobs, history, events and output records: one interface, several stores."""
