"""Taskplat sink: drains the SQS buffers of buffered Postgres datasets into their tables and stores
each write's dataset event.

Run it with `python -m taskplat.sink`; `taskplat.sink.sink` states the invariants.
"""
