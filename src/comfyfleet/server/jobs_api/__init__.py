"""The jobs API: every job, pending to finished."""
