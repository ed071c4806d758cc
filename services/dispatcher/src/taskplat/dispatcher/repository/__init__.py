"""Data access of the dispatcher: named SQL from `tasks.sql` (transitions and reads) and
`metrics.sql` (the gauges of /metrics), run on a caller's connection.

Invariant: repository functions never open or commit a transaction; the caller (the service layer)
owns it, so a state change, its attempt record, its outputs and its outbox row commit together.
"""
