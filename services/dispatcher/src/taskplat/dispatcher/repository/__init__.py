"""Data access of the dispatcher: named SQL from `tasks.sql`, run on a caller's connection.

Invariant: repository functions never open or commit a transaction; the caller (the service layer)
owns it, so a state change, its attempt record, its outputs and its outbox row commit together.
"""
