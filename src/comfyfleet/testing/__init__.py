"""Test support that ships with comfyfleet: local stand-ins for paid APIs."""

#: The environment variable naming the ledger file the `LedgerAppend` testing node
#: appends to. The path is the operator's (the process's environment), never the
#: prompt's: nothing a client sends chooses a file the server writes.
LEDGER_ENV = "COMFYFLEET_TEST_LEDGER"
