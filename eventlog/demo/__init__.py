"""`eventlog demo`: a small end-to-end run with a controller crash and a restore."""
