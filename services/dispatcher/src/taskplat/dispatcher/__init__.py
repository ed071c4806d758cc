"""Taskplat dispatcher: the public task API and the internal worker API (Starlette on uvicorn).

Invariant: the dispatcher is the only writer of task state besides the loops, and every write it
makes is a guarded transition committed with its attempt record, outputs, events and outbox rows.
"""
