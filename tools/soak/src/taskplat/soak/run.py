"""`make soak`: a steady load through a private stack for a long time; every series sampled, each
judged bounded or not, a report with a plot of each.

The run:
1. A private stack (`Stack`, the code of `make up`): its own Postgres and SQS endpoint (or the
   one given), one process of each service, `workers` worker wrappers. The reaper's retention is
   short (`retention_seconds`, default a quarter of the duration, at most 5 minutes) so that the
   task and outbox tables reach a steady size within the first half.
2. A DAG (`soak`) with a buffered_postgres dataset: job `produce` writes it (a run started every
   `job_every` seconds), job `react` reads it (started by the sink's events).
3. The load (`load.SteadyLoad`) for `duration` seconds: `rate` echo tasks per second, the job
   runs, `records_per_second` records to the dataset's buffer.
4. Every `sample_every` seconds, a sample (`sampler.Sampler`): each service process's RSS, open
   fds and threads, Postgres connections per application_name, each table's dead tuples and size,
   the backlog of Queued tasks.
5. The verdict (`verdict.decide`, the rule in docs/operations.md "Soak"): FAIL when the stack
   lagged (the Queued backlog grew: completed against offered rate), when a series leaked (grew
   without bound over the second half; a table only while the backlog was flat), when a service
   exited (crash or restart), or when a call of the load failed; each problem line says which.
   The report goes to `report_dir` (soak.md, soak.json, plots/*.png).

Invariants:
- Processes are started and stopped from the calling thread only; the load thread only speaks
  HTTP and SQS; sampling happens on the calling thread.
- The stack is stopped whatever happens; the report is written whenever the load ran.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.sqs import sqs_client
from taskplat.devstack.stack import Stack, StackConfig
from taskplat.devstack.waiting import wait_for
from taskplat.soak import report
from taskplat.soak.load import SteadyLoad
from taskplat.soak.sampler import Sampler
from taskplat.soak.series import Judgement
from taskplat.soak.verdict import Rates, decide

Say = Callable[[str], None]
DAG = "soak"
LOAD_GRACE_SECONDS = 60.0  # how long the load may run past its duration (its last retried calls)
DATASET = "soak-records"

STACK_ENV: dict[str, str] = {
    "TASKPLAT_LOG_FORMAT": "json",
    "TASKPLAT_LOG_LEVEL": "WARNING",
    "TASKPLAT_WORKER_CONCURRENCY": "8",
    "TASKPLAT_WORKER_DRAIN_TIMEOUT_SECONDS": "5",
    "TASKPLAT_WORKER_KILL_GRACE_SECONDS": "1",
    "TASKPLAT_WORKER_SHUTDOWN_REPORT_TIMEOUT_SECONDS": "5",
    # A stopping wrapper waits for its open waiting claim: no longer than the SQS long poll (5 s
    # in development) rather than the default 10 s.
    "TASKPLAT_WORKER_POLL_WAIT_SECONDS": "5",
}


def _dag() -> dict[str, Any]:
    schema = [{"name": "severity", "type": "text"}, {"name": "value", "type": "bigint"}]
    return {
        "jobs": {
            "produce": {
                "operator": "echo",
                "outputs": [
                    {"index": 0, "dataset": DATASET, "kind": "buffered_postgres", "schema": schema}
                ],
            },
            "react": {"operator": "echo", "inputs": [{"from": {"dataset": DATASET}}]},
        }
    }


@dataclass(frozen=True)
class SoakConfig:
    run_dir: Path
    report_dir: Path
    rate: float = 200.0  # tasks per second
    duration: float = 1200.0  # seconds of load
    sample_every: float = 10.0
    workers: int = 2
    records_per_second: float = 50.0
    job_every: float = 5.0  # seconds between two runs of the DAG's `produce` job (0: none)
    retention_seconds: float | None = None  # default: duration / 4, at most 300
    sqs_endpoint_url: str | None = None

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.duration <= 0 or self.sample_every <= 0:
            raise DevstackError("the soak's rate, duration and sampling interval must be positive")
        if self.duration < 2 * self.sample_every:
            raise DevstackError("the soak must last at least two sampling intervals")
        if self.workers < 1:
            raise DevstackError("the soak needs at least one worker wrapper")
        if self.records_per_second < 0 or self.job_every < 0:
            raise DevstackError("records per second and the job interval must be 0 or more")

    @property
    def retention(self) -> float:
        if self.retention_seconds is not None:
            return self.retention_seconds
        return max(5.0, min(300.0, self.duration / 4))


@dataclass
class SoakResult:
    ok: bool
    judgements: list[Judgement]
    problems: list[str]
    totals: dict[str, Any]
    report_dir: Path
    markdown: str


class SoakRun:
    def __init__(self, config: SoakConfig, say: Say) -> None:
        self.config = config
        self.say = say
        self.tag = uuid.uuid4().hex[:8]  # the run's SQS queue names

    def _stack_config(self) -> StackConfig:
        config = self.config
        env = {
            **STACK_ENV,
            "TASKPLAT_REAPER_RETENTION_SECONDS": f"{config.retention:g}",
            "TASKPLAT_REAPER_OUTBOX_RETENTION_SECONDS": f"{config.retention:g}",
        }
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        return StackConfig(
            run_dir=config.run_dir / "stack",
            workers=config.workers,
            dispatcher_port=None,
            sqs_endpoint_url=config.sqs_endpoint_url,
            queue_prefix=f"soak-{self.tag}-",
            dead_letter_queue=f"soak-{self.tag}-dead-letters",
            keep_data=False,
            inherit_environment=False,
            env=env,
        )

    def run(self) -> SoakResult:
        config = self.config
        config.run_dir.mkdir(parents=True, exist_ok=True)
        self.say(
            f"soak: {config.rate:g} tasks/s for {config.duration:g}s, a sample every "
            f"{config.sample_every:g}s, retention {config.retention:g}s"
        )
        stack = Stack(self._stack_config())
        stack.start()
        try:
            return self._drive(stack)
        finally:
            self.say("soak: stopping the stack ...")
            stack.stop()

    def _apply_dag(self, api: httpx.Client) -> dict[str, Any]:
        applied = api.put(f"/dags/{DAG}", json=_dag())
        if applied.status_code not in (200, 201):
            raise DevstackError(f"applying the soak DAG failed: {applied.text[:300]}")
        datasets = api.get("/datasets").json()["datasets"]
        uuid = next(d["dataset_uuid"] for d in datasets if d["name"] == DATASET)

        def ready() -> dict[str, Any]:
            view: dict[str, Any] = api.get(f"/datasets/{uuid}").json()
            return view if view.get("buffer_queue_url") else {}

        view = wait_for(ready, timeout=60, what="the sink creating the dataset's buffer")
        assert view is not None
        return view

    def _drive(self, stack: Stack) -> SoakResult:
        config = self.config
        info = stack.info
        headers = {"Authorization": f"Bearer {info.api_key}"}
        api = httpx.Client(base_url=info.dispatcher_url, headers=headers, timeout=30.0)
        sqs = sqs_client(info.sqs_endpoint_url, stack.config.aws_region)
        try:
            dataset = self._apply_dag(api)
            table = str(dataset["location"]).removeprefix("postgres_table:")
            sampler = Sampler(info.database_url, data_tables=[table])
            load = SteadyLoad(
                api,
                sqs,
                rate=config.rate,
                duration=config.duration,
                dag=DAG,
                job_every=config.job_every,
                records_per_second=config.records_per_second,
                dataset=dataset,
            )
            try:
                self._sample_while(stack, load, sampler)
            finally:
                load.stop.set()
                load.join(timeout=60)
                sampler.close()
            completed = self._completed(api)
        finally:
            api.close()
            sqs.close()
        return self._verdict(stack, load, sampler, completed)

    def _sample_while(self, stack: Stack, load: SteadyLoad, sampler: Sampler) -> None:
        config = self.config
        load.start()
        started = time.monotonic()
        samples = 0
        while True:
            now = time.monotonic() - started
            sampler.sample(now, stack.pids())
            samples += 1
            if samples % max(1, round(60 / config.sample_every)) == 0:
                self.say(
                    f"soak: {now:.0f}s of {config.duration:g}s, {load.sent['tasks']} tasks sent, "
                    f"{len(load.failures)} failed calls"
                )
            if not load.is_alive() or now >= config.duration + LOAD_GRACE_SECONDS:
                break
            next_at = started + samples * config.sample_every
            load.join(timeout=max(0.0, next_at - time.monotonic()))

    def _completed(self, api: httpx.Client) -> int | None:
        try:
            response = api.get("/metrics")
        except httpx.HTTPError:
            return None
        values = [
            float(line.rsplit(" ", 1)[1])
            for line in response.text.splitlines()
            if line.startswith("taskplat_tasks_completed_total")
        ]
        return int(sum(values)) if values else None

    def _verdict(
        self, stack: Stack, load: SteadyLoad, sampler: Sampler, completed: int | None
    ) -> SoakResult:
        config = self.config
        half = config.duration / 2
        offered = load.sent["tasks"] / config.duration
        done_rate = completed / config.duration if completed is not None else None
        decided = decide(
            sampler.series.values(),
            half=half,
            rate=config.rate,
            rates=Rates(offered=offered, completed=done_rate),
        )
        judgements = decided.judgements
        problems: list[str] = list(decided.problems)
        if load.error is not None:
            problems.append(f"the load stopped: {load.error!r}")
        if load.failures:
            problems.append(
                f"{len(load.failures)} calls of the load failed, e.g. {load.failures[0]}"
            )
        exits = {name: stack.exits(name) for name in stack.services()}
        for name, codes in sorted(exits.items()):
            if codes:
                problems.append(f"{name} exited {len(codes)} time(s) during the soak: {codes}")
        totals: dict[str, Any] = {
            "verdict": decided.kind,
            "tasks sent": load.sent["tasks"],
            "job runs started": load.sent["job_runs_created"],
            "records published": load.sent["records"],
            "tasks completed (the dispatcher's counter)": completed,
            "offered rate (tasks sent per second)": round(offered, 1),
            "completion rate (tasks completed per second, the DAG's included)": (
                round(done_rate, 1) if done_rate is not None else None
            ),
            "samples": max((len(s.points) for s in sampler.series.values()), default=0),
            "series judged": sum(1 for j in judgements if j.judged),
        }
        config_json = {k: str(v) for k, v in asdict(config).items()}
        config_json["retention (effective)"] = f"{config.retention:g}"
        markdown = report.write(
            config.report_dir,
            config=config_json,
            totals=totals,
            series=list(sampler.series.values()),
            judgements=judgements,
            half=half,
            problems=problems,
        )
        ok = not problems
        return SoakResult(ok, judgements, problems, totals, config.report_dir, markdown)


def main(config: SoakConfig, say: Say | None = None) -> int:
    def default_say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    result = SoakRun(config, say or default_say).run()
    for problem in result.problems:
        print(f"soak: {problem}", flush=True)
    print(
        f"soak: report in {result.report_dir}/soak.md; result: "
        + ("PASS" if result.ok else "FAIL"),
        flush=True,
    )
    return 0 if result.ok else 1
