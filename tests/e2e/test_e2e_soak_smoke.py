"""End to end, `make soak` at small scale: 30 seconds of a low steady load (echo tasks, runs of
the soak DAG's job, records through its buffered dataset) through a private stack; the report
(soak.md, soak.json, a PNG per series) is written, every service and table was sampled, and
nothing grows without bound.

The run is the one `make soak` runs (`taskplat.soak.run`), in this process, against the
session's SQS endpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taskplat.soak.run import SoakConfig, SoakRun

pytestmark = pytest.mark.e2e

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(480)  # 30 s of load, a stack's start and stop, 60-odd plots on a busy machine
def test_a_half_minute_soak_writes_its_report_and_passes_the_slope_test(
    sqs_endpoint_url: str, tmp_path: Path
) -> None:
    config = SoakConfig(
        run_dir=tmp_path / "soak",
        report_dir=tmp_path / "report",
        rate=10.0,
        # 30 s, a sample every 1.5 s: 10 or more samples in the second half, twice the fewest
        # the slope test judges.
        duration=30.0,
        sample_every=1.5,
        records_per_second=10.0,
        job_every=2.5,
        sqs_endpoint_url=sqs_endpoint_url,
    )
    result = SoakRun(config, say=print).run()
    print(result.markdown)

    assert result.ok, result.problems
    sent = round(config.rate * config.duration)
    assert result.totals["tasks sent"] == sent
    assert result.totals["job runs started"] >= 10
    assert result.totals["records published"] > 0
    # Every task sent, job run and dataset-triggered run was completed but the last few.
    assert result.totals["tasks completed (the dispatcher's counter)"] >= sent - 50

    names = {j.name for j in result.judgements}
    for service in ("dispatcher", "relay", "scheduler", "reaper", "sink", "worker-1", "worker-2"):
        assert {f"rss {service}", f"fds {service}", f"threads {service}"} <= names, service
    for application in ("dispatcher", "outbox-relay", "scheduler", "reaper", "sink"):
        assert f"connections taskplat-{application}" in names
    for table in ("tasks", "task_attempts", "outbox", "task_events"):
        assert {f"dead_tuples {table}", f"relation_bytes {table}"} <= names
    assert "backlog queued tasks" in names
    judged = [j for j in result.judgements if j.judged]
    assert judged and all(j.level is not None for j in judged)  # enough samples to judge

    document = json.loads((config.report_dir / "soak.json").read_text())
    assert document["ok"] is True
    assert (config.report_dir / "soak.md").read_text().startswith("# Soak report")
    for plot in document["plots"].values():
        assert (config.report_dir / plot).read_bytes()[:8] == PNG_MAGIC
    assert len(document["plots"]) == len(result.judgements)
