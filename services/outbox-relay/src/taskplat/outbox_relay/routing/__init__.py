"""Routing: stored dataset events -> the downstream tasks of the jobs that read the dataset.

The relay performs a `route_event` outbox row by calling `route_events` inside its batch
transaction (`dataset_events.py`, its statements in `dataset_events.sql`).

Invariants (stated in full in `dataset_events`):
  * nothing here commits: the tasks, their wake-ups, the route keys and the routed marks commit
    with the outbox rows marked sent, or not at all;
  * each event is routed once, and at most one task is created per (job, dataset, version,
    position) ever;
  * only events of their dataset's current version are routed (the dataset rows share-locked
    first); a position is routed once, for the first event routed there.
"""

from taskplat.outbox_relay.routing.dataset_events import RoutedEvent, route_events

__all__ = ["RoutedEvent", "route_events"]
