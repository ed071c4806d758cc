"""Reading the dispatcher's /metrics in tests (Prometheus text parsed into samples), and the
database setup of the metrics tests (`dispatcher_metrics.sql`).

Invariants: parsing uses prometheus_client's own parser, so a test fails if the exposition is not
valid Prometheus text; samples are keyed by their name and their full label set. Setup helpers
open, commit and close their own connection.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

import psycopg
from prometheus_client.parser import text_string_to_metric_families

from taskplat.common.db.queries import parse_queries
from taskplat.testkit.dispatcher_harness import Dispatcher

_SQL_PATH = Path(__file__).with_name("dispatcher_metrics.sql")
Q = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))

Labels = frozenset[tuple[str, str]]


class Scrape:
    """One /metrics answer."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, Labels], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def value(self, name: str, **labels: str) -> float | None:
        """The sample of `name` with exactly `labels`, or None when absent."""
        return self.samples.get((name, frozenset(labels.items())))

    def series(self, name: str, *label_names: str) -> dict[tuple[str, ...], float]:
        """Every sample of `name`, keyed by the values of `label_names` (in that order)."""
        found: dict[tuple[str, ...], float] = {}
        for (sample_name, labels), value in self.samples.items():
            if sample_name == name:
                as_dict: Mapping[str, str] = dict(labels)
                found[tuple(as_dict[label] for label in label_names)] = value
        return found


def scrape(dispatcher: Dispatcher) -> Scrape:
    response = dispatcher.anonymous.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain"), response.headers
    return Scrape(response.text)


def install_poison_triggers(db_url: str) -> None:
    """Make an output at location `poison` and an outbox row of queue `poison` fail (422)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(Q["install_poison_triggers"])


def fill_history(db_url: str, count: int, now: datetime) -> None:
    """`count` finished tasks over the days before `now`, each with its sent outbox row."""
    with psycopg.connect(db_url) as conn:
        conn.execute(Q["fill_finished_tasks"], {"count": count, "now": now})
        conn.execute(Q["fill_sent_outbox"])


def analyze(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(Q["analyze"])
