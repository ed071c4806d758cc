"""Reading a Prometheus text exposition in the wrapper's tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: bytes | str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample called `name` (the full sample name, e.g. `..._total`, `..._count`)."""
    decoded = text.decode() if isinstance(text, bytes) else text
    return [
        (dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(decoded)
        for sample in family.samples
        if sample.name == name
    ]


def value(text: bytes | str, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels` (0 when none)."""
    return sum(
        number
        for sample_labels, number in samples(text, name)
        if all(sample_labels.get(key) == wanted for key, wanted in labels.items())
    )


def by_label(text: bytes | str, name: str, label: str, **labels: str) -> dict[str, float]:
    """The samples called `name` matching `labels`, summed by the value of `label`."""
    totals: dict[str, float] = {}
    for sample_labels, number in samples(text, name):
        if all(sample_labels.get(key) == wanted for key, wanted in labels.items()):
            key = sample_labels.get(label, "")
            totals[key] = totals.get(key, 0.0) + number
    return totals
