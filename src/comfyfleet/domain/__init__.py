"""The domain records every part of comfyfleet speaks in (jobs, remote jobs)."""
