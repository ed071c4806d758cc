"""`make bench PEER_BENCH=DIR`: the side-by-side harness is run, and its figures reported beside
the bench's with Taskplat's ratios and the targets."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from taskplat.bench.peers import compare, load_results, render_lines, run_harness
from taskplat.devstack.errors import DevstackError


def result(peer: str, drain: float, p50: float, p99: float, **extra: Any) -> dict[str, Any]:
    return {
        "peer": peer,
        "w1": {"e2e_rate": drain, "exactly_once": "3/3"},
        "w2": {"p50_ms": p50, "p95_ms": p99 * 0.8, "p99_ms": p99},
        **extra,
    }


RESULTS = {
    "taskplat": result("taskplat", 1500.0, 4.5, 12.0, w3={"rerun_after_s": 6.1, "outcome": "x"}),
    "celery-redis": result("celery-redis", 1157.0, 2.7, 4.1),
    "celery-sqs-ls": result("celery-sqs-ls", 150.0, 7.3, 10.8),
    "procrastinate": result("procrastinate", 638.0, 4.1, 5.6),
}


def test_compare_gives_the_ratios_and_judges_each_target() -> None:
    comparison = compare(RESULTS)
    targets = {
        t["target"].split(" ")[0] + t["target"].split(" ")[1]: t for t in comparison["targets"]
    }
    assert targets["W1drain"]["ratio"] == pytest.approx(1500 / 1157)
    assert targets["W1drain"]["met"] is True
    assert targets["W2p99"]["ratio"] == pytest.approx(12.0 / 10.8) and targets["W2p99"]["met"]
    assert targets["W2p50"]["ratio"] == pytest.approx(4.5 / 4.1) and targets["W2p50"]["met"]
    assert targets["W3re-run"]["met"] is True
    slower = dict(RESULTS, taskplat=result("taskplat", 800.0, 6.6, 194.5))
    missed = {t["target"]: t["met"] for t in compare(slower)["targets"]}
    assert list(missed.values())[:4] == [False, False, False, None]  # W3 not measured
    lines = "\n".join(render_lines(compare(slower)))
    assert "**missed**" in lines and "0.69x" in lines and "| procrastinate | 638 |" in lines


def test_a_peer_that_failed_is_shown_not_dropped() -> None:
    failed = dict(RESULTS, procrastinate={"peer": "procrastinate", "error": "RuntimeError: boom"})
    comparison = compare(failed)
    assert comparison["peers"]["procrastinate"]["error"] == "RuntimeError: boom"
    p50 = next(t for t in comparison["targets"] if t["target"].startswith("W2 p50"))
    assert p50["met"] is None
    assert "RuntimeError: boom" in "\n".join(render_lines(comparison))


def _script(path: Path, text: str) -> None:
    path.write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_run_harness_sets_it_up_runs_it_and_reads_the_folder_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness, root, checkout = tmp_path / "harness", tmp_path / "root", tmp_path / "checkout"
    harness.mkdir()
    (checkout / "libs" / "lambda-runtime").mkdir(parents=True)
    (harness / "bench.py").write_text("")
    # setup.sh makes the venv's pip (here a script recording what it installs).
    _script(
        harness / "setup.sh",
        'mkdir -p "$PEERBENCH_ROOT/venv/bin"\n'
        'printf \'#!/usr/bin/env bash\\necho "$@" > "$PEERBENCH_ROOT/pip-args"\\n\' '
        '> "$PEERBENCH_ROOT/venv/bin/pip"\nchmod +x "$PEERBENCH_ROOT/venv/bin/pip"\n',
    )
    figures = json.dumps(RESULTS["taskplat"])
    _script(
        harness / "run.sh",
        'out="$PEERBENCH_ROOT/results/20260101-000000"; mkdir -p "$out"\n'
        f"echo '{figures}' > \"$out/taskplat.json\"\n"
        'echo "$PEERS|$REPS|$WORKLOADS|$TASKPLAT_CHECKOUT|$1" > "$PEERBENCH_ROOT/run-args"\n',
    )
    log = tmp_path / "peers.log"
    monkeypatch.setenv("PEERBENCH_ROOT", str(root))
    peers = ("taskplat", "celery-redis")
    folder = run_harness(harness, checkout, log, peers=peers, reps=2, tasks=500)
    assert load_results(folder)["taskplat"]["w1"]["e2e_rate"] == 1500.0
    run_args = (root / "run-args").read_text().strip()
    assert run_args == f"taskplat celery-redis|2|w1,w2,w3|{checkout}|500"
    assert str(checkout / "libs" / "lambda-runtime") in (root / "pip-args").read_text()
    assert "run.sh" in log.read_text()


def test_run_harness_refuses_a_folder_that_is_not_a_harness(tmp_path: Path) -> None:
    with pytest.raises(DevstackError, match="not a peer harness"):
        run_harness(tmp_path, tmp_path, tmp_path / "log")


def test_a_failing_harness_is_an_error_naming_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "bench.py").write_text("")
    _script(harness / "setup.sh", "echo broken >&2; exit 3\n")
    _script(harness / "run.sh", "exit 0\n")
    monkeypatch.setenv("PEERBENCH_ROOT", str(tmp_path / "root"))
    with pytest.raises(DevstackError, match=r"its setup, exit 3"):
        run_harness(harness, tmp_path, tmp_path / "log")
    assert "broken" in (tmp_path / "log").read_text()
