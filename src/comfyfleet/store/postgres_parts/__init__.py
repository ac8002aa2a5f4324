"""`PostgresStore` by concern: each module holds the verbs of one seam of `store.base`,
over the pool that `access.PostgresAccess` gives them."""
