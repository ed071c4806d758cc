"""Database helpers: connection pools, named-query loading and the migration runner.

Invariant: only services that hold database credentials import this package; it needs the `db`
extra (psycopg, psycopg-pool).
"""
