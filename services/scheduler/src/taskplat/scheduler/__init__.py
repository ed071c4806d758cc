"""Taskplat scheduler: promotes due Scheduled tasks and due retries to Queued, and re-publishes
wake-ups for Queued tasks nobody claimed. Run it with `python -m taskplat.scheduler`."""
