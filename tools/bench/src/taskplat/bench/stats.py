"""Arithmetic of the benchmark's figures: percentiles of one run, medians across runs.

Invariants:
- `percentile` is the nearest-rank percentile (a value that was measured, never interpolated).
- `combine` turns N runs' figure trees into one tree of the same shape: numbers become their
  median, booleans the AND of all runs (a guarantee must hold in every run), and anything else
  (strings, lists) is taken from the last run. A key missing from some runs is combined over
  the runs that have it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence (nan when empty)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def combine(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The median tree of several runs' figure trees (see the module doc)."""
    keys: dict[str, None] = {}
    for run in runs:
        keys.update(dict.fromkeys(run))
    combined: dict[str, Any] = {}
    for key in keys:
        values = [run[key] for run in runs if key in run]
        if all(isinstance(v, Mapping) for v in values):
            combined[key] = combine(values)
        elif all(isinstance(v, bool) for v in values):
            combined[key] = all(values)
        elif all(_is_number(v) for v in values):
            finite = [float(v) for v in values if not math.isnan(float(v))]
            combined[key] = round(statistics.median(finite), 4) if finite else math.nan
        else:
            combined[key] = values[-1]
    return combined


def spread(runs: Sequence[Mapping[str, Any]], path: Sequence[str]) -> tuple[float, float] | None:
    """(min, max) of the number at `path` across runs, None when no run has one."""
    values: list[float] = []
    for run in runs:
        node: Any = run
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        if _is_number(node) and not math.isnan(float(node)):
            values.append(float(node))
    return (min(values), max(values)) if values else None
