"""What the benchmark reads from the running processes: peak memory and CPU time from /proc,
Prometheus counters from the services' /metrics, and SQS requests from the SQS server's log.

Invariants:
- Every reader is read-only and tolerates a process that exits meanwhile (it counts as absent).
- CPU time of a process tree = utime + stime + cutime + cstime of every live process in it, so
  children that already exited and were reaped inside the tree still count; figures are
  differences of two snapshots, in seconds.
- SQS requests are counted from the server's own request log (LocalStack logs one
  `AWS sqs.<Operation> => <status>` line per request), so the count covers every client (relay,
  wrappers, scheduler) whatever counters they export. moto's log names no operation: its
  requests are counted as `unknown`.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

_TICKS = os.sysconf("SC_CLK_TCK")
_LOCALSTACK_REQUEST = re.compile(rb"AWS sqs\.([A-Za-z]+) => (\d+)")
_MOTO_REQUEST = re.compile(rb'"POST [^"]* HTTP/1\.[01]" (\d+)')
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except OSError:
            continue
        found.extend(int(part) for part in text.split())
    return found


def process_tree(pid: int) -> list[int]:
    """`pid` and its live descendants (empty when `pid` is gone)."""
    if not Path(f"/proc/{pid}").exists():
        return []
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(_children(current))
    return tree


def process_gone(pid: int) -> bool:
    """True once `pid` no longer runs (a zombie counts as gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _cpu_ticks(pid: int, *, reaped: bool = True) -> int:
    """utime + stime (+ cutime + cstime: its reaped children's, when `reaped`)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    # After the command: state(0) ... utime(11) stime(12) cutime(13) cstime(14).
    return sum(int(value) for value in fields[11 : 15 if reaped else 13])


def tree_cpu_seconds(pid: int) -> float:
    return sum(_cpu_ticks(p) for p in process_tree(pid)) / _TICKS


def own_cpu_seconds(pid: int) -> float:
    """The process's own CPU time (its threads; none of its children's)."""
    return _cpu_ticks(pid, reaped=False) / _TICKS


def status_kib(pid: int, field: str) -> int | None:
    """A `/proc/<pid>/status` size field (`VmHWM`, `VmRSS`) in KiB, None when unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss_mib(pids: Mapping[str, int]) -> dict[str, float]:
    """Peak resident memory (VmHWM) of each named process, in MiB; the pooled operator
    processes of a worker wrapper are reported as `<name>/operators` (their sum)."""
    peaks: dict[str, float] = {}
    for name, pid in sorted(pids.items()):
        own = status_kib(pid, "VmHWM")
        if own is not None:
            peaks[name] = round(own / 1024, 1)
        if name.startswith("worker"):
            children = [status_kib(p, "VmHWM") or 0 for p in process_tree(pid)[1:]]
            if children:
                peaks[f"{name}/operators"] = round(sum(children) / 1024, 1)
    return peaks


@dataclass(frozen=True)
class CpuSnapshot:
    seconds: dict[str, float]
    wall: float


def cpu_snapshot(
    groups: Mapping[str, Iterable[int]], wall: float, *, split_children: Iterable[str] = ()
) -> CpuSnapshot:
    """CPU seconds so far of each named group of process trees; for the groups named in
    `split_children`, the processes' own time stays under the group's name and their
    children's goes to `<name> children`."""
    seconds: dict[str, float] = {}
    split = set(split_children)
    for name, pids in groups.items():
        tree = sum(tree_cpu_seconds(pid) for pid in pids)
        if name in split:
            own = sum(own_cpu_seconds(pid) for pid in pids)
            seconds[name], seconds[f"{name} children"] = own, tree - own
        else:
            seconds[name] = tree
    return CpuSnapshot(seconds, wall)


def cpu_split(before: CpuSnapshot, after: CpuSnapshot) -> dict[str, float]:
    """CPU seconds each group used between the snapshots (groups present in both)."""
    return {
        name: round(max(after.seconds[name] - before.seconds.get(name, 0.0), 0.0), 3)
        for name in after.seconds
        if name in before.seconds
    }


# -- /metrics --------------------------------------------------------------------------------


def scrape(url: str, prefix: str = "taskplat_sqs_") -> dict[str, float]:
    """The samples of `<url>/metrics` whose name starts with `prefix` (key: `name{labels}`);
    empty when the endpoint does not answer."""
    try:
        response = httpx.get(f"{url}/metrics", timeout=5.0)
    except httpx.HTTPError:
        return {}
    if response.status_code != 200:
        return {}
    samples: dict[str, float] = {}
    for line in response.text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or not match.group(1).startswith(prefix):
            continue
        try:
            samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
        except ValueError:
            continue
    return samples


def counter_deltas(
    before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]]
) -> dict[str, dict[str, float]]:
    """Per process, how much each counter grew (non-zero growth only)."""
    deltas: dict[str, dict[str, float]] = {}
    for name, samples in after.items():
        earlier = before.get(name, {})
        grown = {
            key: value - earlier.get(key, 0.0)
            for key, value in samples.items()
            if key.endswith("_total") or "_total{" in key
        }
        grown = {key: value for key, value in grown.items() if value}
        if grown:
            deltas[name] = grown
    return deltas


# -- the SQS server's request log ------------------------------------------------------------


class SqsRequestLog:
    """Counts the requests the SQS server logged after `mark()`."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path
        self._offset = 0

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def mark(self) -> None:
        self._offset = self._size()

    def count(self) -> Counter[str]:
        """Requests by operation since `mark()` (failed ones too, e.g. `ReceiveMessage`)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return Counter()
        if self.kind == "localstack":
            return Counter(m.group(1).decode() for m in _LOCALSTACK_REQUEST.finditer(data))
        return Counter("unknown" for _ in _MOTO_REQUEST.finditer(data))

    def size(self) -> int:
        return self._size()
