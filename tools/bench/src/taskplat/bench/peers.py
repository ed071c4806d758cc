"""The peer comparison of `make bench`: a side-by-side harness's figures beside the bench's own.

The harness is optional: a folder with `setup.sh`, `run.sh` and `bench.py` that measures other
task queues and Taskplat with one driver (W1 drain of no-op tasks, W2 latency at 50/s to idle
workers, W3 re-run after a kill -9). Given `--peers DIR` (`make bench PEER_BENCH=DIR`), the bench
runs it after its own workloads, in the same session, and reports each peer's figures and
Taskplat's ratio to each, against the targets of docs/performance.md ("Against the peers").

Invariants:
- The harness measures the checkout the bench runs (`TASKPLAT_CHECKOUT`); the operator runtime
  its Taskplat operators import is installed into the harness's venv from `libs/lambda-runtime`,
  as an operator image installs it.
- Its console output goes to `<run dir>/peers.log`; its figures are read from the JSON file it
  writes per peer in the results folder it created, never parsed from its console.
- A harness that fails, or a peer it could not measure, is reported as such: the bench's own
  figures stand, and the record says what is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from taskplat.devstack.errors import DevstackError

DEFAULT_PEERS = ("taskplat", "celery-redis", "celery-sqs-ls", "procrastinate")
HARNESS_LEASE_SECONDS = 5.0  # the lease of the harness's W3 durable mode for Taskplat

# (name, Taskplat's figure, the peer, the peer's figure, the bound, at least (True) / at most)
TARGETS = (
    ("W1 drain >= 1.2x Celery + Redis", ("w1", "e2e_rate"), "celery-redis", 1.2, True),
    ("W2 p99 <= 1.5x Celery on the same SQS", ("w2", "p99_ms"), "celery-sqs-ls", 1.5, False),
    ("W2 p50 <= 1.2x Procrastinate", ("w2", "p50_ms"), "procrastinate", 1.2, False),
)


def checkout_root() -> Path:
    """The checkout the bench runs: the git work tree around the current directory."""
    done = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=False
    )
    return Path(done.stdout.strip()) if done.returncode == 0 else Path.cwd()


def _harness_root(env: Mapping[str, str]) -> Path:
    return Path(env.get("PEERBENCH_ROOT") or Path(env.get("TMPDIR") or "/tmp") / "peerbench")


def run_harness(
    harness: Path,
    checkout: Path,
    log_path: Path,
    *,
    peers: Sequence[str] = DEFAULT_PEERS,
    reps: int = 3,
    tasks: int = 5000,
) -> Path:
    """Set the harness up, run it, and return the results folder it wrote."""
    for name in ("setup.sh", "run.sh", "bench.py"):
        if not (harness / name).is_file():
            raise DevstackError(f"--peers {harness}: no {name} there (not a peer harness)")
    env = dict(os.environ, TASKPLAT_CHECKOUT=str(checkout), PEERS=" ".join(peers))
    env.update(REPS=str(reps), WORKLOADS="w1,w2,w3")
    root = _harness_root(env)
    results = root / "results"
    before = set(results.iterdir()) if results.is_dir() else set()
    with log_path.open("a", encoding="utf-8") as log:
        _step(["bash", str(harness / "setup.sh")], env, log, checkout, "its setup")
        pip = [str(root / "venv" / "bin" / "pip"), "install", "--quiet"]
        _step([*pip, str(checkout / "libs" / "lambda-runtime")], env, log, checkout, "pip")
        _step(["bash", str(harness / "run.sh"), str(tasks)], env, log, checkout, "run.sh")
    made = sorted(set(results.iterdir()) - before) if results.is_dir() else []
    if not made:
        raise DevstackError(f"the peer harness wrote no results folder under {results}")
    return made[-1]


def _step(argv: list[str], env: Mapping[str, str], log: Any, cwd: Path, what: str) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    done = subprocess.run(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise DevstackError(f"the peer harness failed ({what}, exit {done.returncode})")


def load_results(folder: Path) -> dict[str, dict[str, Any]]:
    """The harness's figures by peer (one JSON file per peer)."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        found[str(data.get("peer") or path.stem)] = data
    return found


def _figure(result: Mapping[str, Any] | None, path: Sequence[str]) -> float | None:
    value: Any = result
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, int | float) else None


def compare(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Each peer's figures, Taskplat's ratio to each, and the targets met or missed."""
    ours = results.get("taskplat")
    peers: dict[str, Any] = {}
    for name, result in results.items():
        peers[name] = {
            "w1_drain_per_s": _figure(result, ("w1", "e2e_rate")),
            "w1_exactly_once": (result.get("w1") or {}).get("exactly_once"),
            "w2_p50_ms": _figure(result, ("w2", "p50_ms")),
            "w2_p95_ms": _figure(result, ("w2", "p95_ms")),
            "w2_p99_ms": _figure(result, ("w2", "p99_ms")),
            "w3_rerun_s": _figure(result, ("w3", "rerun_after_s")),
            "w3_outcome": (result.get("w3") or {}).get("outcome"),
            "error": result.get("error"),
        }
    targets = []
    for label, path, peer, bound, at_least in TARGETS:
        mine, theirs = _figure(ours, path), _figure(results.get(peer), path)
        ratio = mine / theirs if mine is not None and theirs else None
        met = None if ratio is None else (ratio >= bound if at_least else ratio <= bound)
        targets.append({"target": label, "ratio": ratio, "met": met})
    rerun = _figure(ours, ("w3", "rerun_after_s"))
    limit = HARNESS_LEASE_SECONDS + 2
    targets.append(
        {
            "target": f"W3 re-run within the lease + 2 s ({limit:g} s)",
            "ratio": None,
            "seconds": rerun,
            "met": None if rerun is None else rerun <= limit,
        }
    )
    once = peers.get("taskplat", {}).get("w1_exactly_once")
    if once:
        reps, _, total = str(once).partition("/")
        targets.append({"target": "W1 exactly once in every run", "met": reps == total})
    return {"peers": peers, "targets": targets}


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render_lines(comparison: Mapping[str, Any]) -> list[str]:
    """The comparison as markdown: one row per peer, then the targets."""
    if comparison.get("error"):
        return ["## Against the peers", "", f"**Not measured**: {comparison['error']}", ""]
    peers = comparison["peers"]
    ours = peers.get("taskplat", {})
    lines = [
        "## Against the peers (one run of the side-by-side harness, this session)",
        "",
        "| peer | W1 drain/s | Taskplat's W1 ratio | W2 p50 / p95 / p99 ms "
        "| Taskplat's p50 / p99 ratio | W3 re-run |",
        "|---|---:|---:|---|---|---|",
    ]
    for name, row in peers.items():
        w1_ratio = _ratio(ours.get("w1_drain_per_s"), row["w1_drain_per_s"])
        p50 = _ratio(ours.get("w2_p50_ms"), row["w2_p50_ms"])
        p99 = _ratio(ours.get("w2_p99_ms"), row["w2_p99_ms"])
        w2 = " / ".join(_num(row[key], 1) for key in ("w2_p50_ms", "w2_p95_ms", "w2_p99_ms"))
        w3 = row["w3_outcome"] or "-"
        if row.get("error"):
            w3 += f" (error: {row['error']})"
        lines.append(
            f"| {name} | {_num(row['w1_drain_per_s'])} | {w1_ratio} | {w2} | {p50} / {p99} | {w3} |"
        )
    lines += ["", "Targets:", ""]
    for target in comparison["targets"]:
        state = {True: "met", False: "**missed**", None: "not measured"}[target["met"]]
        figure = ""
        if target.get("ratio") is not None:
            figure = f": {target['ratio']:.2f}x"
        elif target.get("seconds") is not None:
            figure = f": {target['seconds']:.1f} s"
        lines.append(f"- {target['target']}{figure}, {state}")
    return [*lines, ""]


def _ratio(mine: float | None, theirs: float | None) -> str:
    return "-" if mine is None or not theirs else f"{mine / theirs:.2f}x"
