"""Taskplat outbox relay: drains pending `outbox` rows into SQS wake-ups and dead-letter records.

Run it with `python -m taskplat.outbox_relay`; `taskplat.outbox_relay.relay` states the invariants.
"""
