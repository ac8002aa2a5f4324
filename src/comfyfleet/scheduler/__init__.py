"""Scheduling: admission, dispatch of queued jobs to lane slots, cancellation."""
