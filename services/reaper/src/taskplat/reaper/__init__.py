"""Taskplat reaper: times out expired leases and overrun deadlines, expires tasks that never
started, prunes old finished tasks and sent outbox rows. Run it with `python -m taskplat.reaper`."""
