"""The store's seam, by concern: one small Protocol a module, each implemented once per
backend (sqlite_parts/, postgres_parts/) and composed into `base.JobStore`."""
