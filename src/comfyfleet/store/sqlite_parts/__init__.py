"""`SQLiteStore` by concern: each module holds the verbs of one seam of `store.base`,
over the writer and readers that `access.SQLiteAccess` gives them."""
