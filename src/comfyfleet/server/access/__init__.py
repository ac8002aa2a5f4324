"""Who may do what: tokens, the login page, trusted proxies."""
