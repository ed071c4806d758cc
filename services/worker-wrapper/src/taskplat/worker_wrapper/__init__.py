"""Taskplat worker wrapper: receives wake-ups from SQS, claims tasks from the dispatcher, runs
operator code in child processes, heartbeats and completes.

Invariant: nothing in this package imports `taskplat.common.db` or psycopg; a worker image holds no
database code and no database credentials. Importing this package is cheap (operators started with
`python -m taskplat.worker_wrapper.examples.*` import it).
"""
