"""Taskplat's shared library: contracts, settings, logging, clock, database and migrations.

Invariant: nothing in this package imports a service, and nothing outside `taskplat.common.db`
imports psycopg, so a worker image can use the rest without database code.
"""
