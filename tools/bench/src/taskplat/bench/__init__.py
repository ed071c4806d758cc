"""`make bench`: Taskplat's benchmark on a private local stack.

    python -m taskplat.bench [--runs 3] [--only W1,W2] [--variant NAME=ENV=VAL,...]

Workloads (see `throughput.py` and `recovery.py`): W1 throughput of no-op tasks, W2
enqueue-to-start latency at a steady rate, W3 recovery from a killed worker wrapper, W4 W1 over
a million finished tasks, W5 records through buffered datasets' sinks (`buffered.py`); plus each
service's peak memory during W1. Results go to
`bench/results/latest.json` and `latest.md`.

Invariants: importing this package starts nothing; everything the bench starts runs under its
own directory (default `.run/bench`) on free ports and is stopped when the bench ends.
"""

from __future__ import annotations
