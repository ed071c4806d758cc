"""`make chaos`: N tasks through a private stack while SQS loses, duplicates and fails messages,
services die by SIGKILL and Postgres crashes; then what went wrong, counted two ways.

The run:
1. A private stack (`Stack`): its own Postgres (fsync on: a crash must not lose a commit),
   `replicas` processes of each service (dispatcher, relay, scheduler, reaper, sink), `workers`
   worker wrappers running the chaos operator (`recording_operator.py`, pooled), all talking to
   SQS through an `SqsFaultInjector` in front of a local SQS endpoint (LocalStack, or the one
   given), and to the dispatchers through a `DispatcherBalancer` (round robin per request). The
   stack's intervals are short so that a lost wake-up is re-published by the scheduler, and a
   killed wrapper's lease expires, well within the run. The `waiting_claims` variant keeps the
   wrappers' waiting claims on the dispatcher; without it (`TASKPLAT_WORKER_POLL_DISPATCHER` and
   `TASKPLAT_WORKER_CLAIM_AHEAD` false) every task is claimed from a wake-up received from SQS.
2. The fault window (`fault_seconds`): the injector's rates are on; tasks are submitted in
   batches (`POST /tasks/batch`, idempotency keys, retried while the dispatcher is down) spread
   over the first part of the window; at random moments (mean `kill_every` seconds apart) a
   random process (one replica of the dispatcher, relay, scheduler or reaper, or a worker
   wrapper) gets SIGKILL and the supervisor restarts it; `postgres_restarts` times, at random
   moments, Postgres is stopped in immediate mode and started again.
3. The faults stop (rates 0, no more kills); the run waits, up to `drain_seconds`, for every task
   to be Completed, then for the SQS task queue to empty (no wake-up left that could start a run).
4. The verdict, from the database (tasks, task_attempts) and from the operators' own record file:
   tasks lost (not Completed; in the record: no run at all), tasks completed twice (two accepted
   completions; in the record: one attempt run to the end twice), attempts that overlapped (two
   attempts' lease periods; in the record: two runs' [start, end]). Any of them: exit 1. Beside
   it, how each completed attempt was claimed (from the balancer's record: an SQS wake-up, a
   waiting claim, a claim ahead) and how many wake-ups SQS delivered (from the injector).

`main` runs the variants given (default: both, waiting claims first), each with a fresh stack in
`<run_dir>/<variant>`, and fails when either fails.

Invariants:
- Every random choice comes from `random.Random(seed)` (the injector has its own stream from the
  same seed); the seed is printed, so a run's schedule can be replayed (timing still differs).
- Processes (services, Postgres) are started and restarted from the calling thread only (their
  death signal is tied to it); the submitter thread only speaks HTTP.
- Faults and kills never continue into the drain: the drain measures convergence.
- The summary is printed and written as JSON to `<run_dir>/chaos-summary.json`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, LiteralString

import httpx
import psycopg
from psycopg.rows import dict_row

from taskplat.chaos.balancer import DispatcherBalancer
from taskplat.chaos.injector import FaultRates, SqsFaultInjector
from taskplat.common.db.queries import load_queries
from taskplat.devstack.errors import DevstackError
from taskplat.devstack.ports import free_port
from taskplat.devstack.sqs import LocalSqs, sqs_client
from taskplat.devstack.stack import Stack, StackConfig
from taskplat.devstack.waiting import wait_for

QUERIES = load_queries("taskplat.chaos", "chaos.sql")
OPERATOR_SCRIPT = str(Path(__file__).with_name("recording_operator.py").absolute())
LOOPS = ("dispatcher", "relay", "scheduler", "reaper")  # with the worker wrappers: the victims
REPLICATED = ("dispatcher", "relay", "scheduler", "reaper", "sink")  # `replicas` of each
WAITING_CLAIMS = "waiting-claims"
NO_WAITING_CLAIMS = "no-waiting-claims"
VARIANTS = (WAITING_CLAIMS, NO_WAITING_CLAIMS)
# Without waiting claims, no claim bypasses SQS: no waiting claim and no claim ahead either.
NO_WAITING_CLAIMS_ENV = {
    "TASKPLAT_WORKER_POLL_DISPATCHER": "false",
    "TASKPLAT_WORKER_CLAIM_AHEAD": "false",
}
CLAIM_SOURCES = ("sqs", "waiting_claim", "claim_ahead", "unknown")
BATCH = 100
Say = Callable[[str], None]

# The stack's settings: short leases and a quick re-publish, so recovery happens within the run.
STACK_ENV: dict[str, str] = {
    "TASKPLAT_LOG_FORMAT": "json",
    "TASKPLAT_LOG_LEVEL": "WARNING",
    "TASKPLAT_DISPATCHER_LEASE_TTL_SECONDS": "6",
    "TASKPLAT_REAPER_INTERVAL_SECONDS": "1",
    "TASKPLAT_REAPER_DEADLINE_GRACE_SECONDS": "5",
    "TASKPLAT_SCHEDULER_INTERVAL_SECONDS": "0.5",
    "TASKPLAT_SCHEDULER_REQUEUE_AFTER_SECONDS": "20",
    # No wake-up is held back, neither by a create for the wrappers' waiting claims nor by the
    # relay: every task's wake-up goes through the faulty SQS while those claims race it.
    "TASKPLAT_DISPATCHER_POLLED_WAKEUP_DELAY_SECONDS": "0",
    "TASKPLAT_RELAY_HOLD_DEPTH": "0",
    "TASKPLAT_WORKER_CONCURRENCY": "8",
    "TASKPLAT_WORKER_WAIT_TIME_SECONDS": "2",
    "TASKPLAT_WORKER_VISIBILITY_TIMEOUT_SECONDS": "10",
    "TASKPLAT_WORKER_VISIBILITY_EXTENSION_SECONDS": "4",
    "TASKPLAT_WORKER_DRAIN_TIMEOUT_SECONDS": "3",
    "TASKPLAT_WORKER_KILL_GRACE_SECONDS": "1",
    "TASKPLAT_WORKER_SHUTDOWN_REPORT_TIMEOUT_SECONDS": "3",
}
OPERATORS_YAML = """\
# Written by `make chaos`: the operator that records each run in its own file.
operators:
  chaos:
    command: ["{{python}}", {script}]
    mode: pooled
    pool_size: 8
"""


@dataclass(frozen=True)
class ChaosConfig:
    run_dir: Path
    tasks: int = 10_000
    fault_seconds: float = 90.0
    drain_seconds: float = 300.0
    rates: FaultRates = field(
        default_factory=lambda: FaultRates(
            lose=0.05, duplicate=0.05, fail_receive=0.05, fail_delete=0.05
        )
    )
    kill_every: float = 5.0  # mean seconds between two SIGKILLs (0: none)
    postgres_restarts: int = 2
    workers: int = 2
    replicas: int = 2  # processes of each of REPLICATED
    waiting_claims: bool = True  # False: NO_WAITING_CLAIMS_ENV on the wrappers
    task_sleep: float = 0.005  # seconds each task's operator sleeps
    seed: int | None = None
    sqs_endpoint_url: str | None = None  # a running SQS endpoint to put the injector in front of

    def __post_init__(self) -> None:
        if self.tasks < 1:
            raise DevstackError("chaos needs at least one task")
        if self.fault_seconds <= 0 or self.drain_seconds <= 0:
            raise DevstackError("the fault and drain windows must be positive")
        if self.workers < 1:
            raise DevstackError("chaos needs at least one worker wrapper")
        if self.replicas < 1:
            raise DevstackError("chaos needs at least one replica of each service")

    @property
    def variant(self) -> str:
        return WAITING_CLAIMS if self.waiting_claims else NO_WAITING_CLAIMS


@dataclass
class Verdict:
    """What went wrong, from the database and from the operators' records."""

    lost_db: list[str] = field(default_factory=list)
    lost_records: list[str] = field(default_factory=list)
    completed_twice_db: list[str] = field(default_factory=list)
    completed_twice_records: list[str] = field(default_factory=list)
    overlapped_db: list[str] = field(default_factory=list)
    overlapped_records: list[str] = field(default_factory=list)
    unrecorded_completions: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(asdict(self).values())


@dataclass
class ChaosResult:
    seed: int
    tasks: int
    verdict: Verdict
    injected: dict[str, int]
    sqs_requests: dict[str, int]  # during the fault window
    kills: dict[str, int]
    postgres_restarts: int
    attempt_outcomes: dict[str, int]
    runs_recorded: int
    tasks_run_more_than_once: int
    submit_seconds: float
    drain_seconds: float | None
    queue_empty: bool
    variant: str = WAITING_CLAIMS
    replicas: int = 1
    # How each task's completed attempt was claimed (CLAIM_SOURCES), from the balancer's record.
    completed_by_source: dict[str, int] = field(default_factory=dict)
    claims_by_source: dict[str, int] = field(default_factory=dict)  # every claim answered
    wakeups_received: int = 0  # messages SQS delivered to the wrappers, the whole run
    balancer: dict[str, int] = field(default_factory=dict)  # requests per replica, 502s
    kills_by_process: dict[str, int] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)  # the variant's notable settings
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class _Submitter(threading.Thread):
    """Creates the run's tasks in batches spread over `spread` seconds (HTTP only)."""

    def __init__(
        self, url: str, api_key: str, bodies: list[dict[str, Any]], spread: float, run: str
    ) -> None:
        super().__init__(name="chaos-submitter", daemon=True)
        self.url = url
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.bodies = bodies
        self.spread = spread
        self.run_key = run
        self.error: BaseException | None = None
        self.finished_at: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            self._submit()
        except BaseException as exc:
            self.error = exc
        self.finished_at = time.monotonic()

    def _submit(self) -> None:
        batches = [self.bodies[i : i + BATCH] for i in range(0, len(self.bodies), BATCH)]
        started = time.monotonic()
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=10.0) as client:
            for number, batch in enumerate(batches):
                due = started + self.spread * number / len(batches)
                if self.stop.wait(max(0.0, due - time.monotonic())):
                    return
                self._post(client, batch)

    def _post(self, client: httpx.Client, batch: list[dict[str, Any]]) -> None:
        def attempt() -> bool:
            try:
                response = client.post("/tasks/batch", json={"tasks": batch})
            except httpx.TransportError:
                return False
            if response.status_code >= 500:
                return False
            if response.status_code not in (200, 201):
                raise DevstackError(f"POST /tasks/batch: {response.status_code} {response.text}")
            return True

        wait_for(attempt, timeout=120, what="POST /tasks/batch to succeed", interval=0.2)


def _records(path: Path) -> list[tuple[str, int, float, float, int]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 5:
            rows.append((parts[0], int(parts[1]), float(parts[2]), float(parts[3]), int(parts[4])))
    return rows


def judge(
    records: list[tuple[str, int, float, float, int]],
    task_ids: set[str],
    db: Callable[[str], list[dict[str, Any]]],
) -> tuple[Verdict, int]:
    """The verdict from the database (`db(query name)`) and the operators' records; also how
    many tasks were run to the end more than once (at-least-once execution, not an error)."""
    verdict = Verdict()
    verdict.lost_db = sorted(
        {row["task_id"] for row in db("not_completed")} | (task_ids - _all_tasks(db))
    )
    verdict.completed_twice_db = sorted(row["task_id"] for row in db("completed_twice"))
    verdict.overlapped_db = sorted(
        f"{row['task_id']} attempts {row['earlier']}/{row['later']}"
        for row in db("overlapping_attempts")
    )
    runs: dict[str, list[tuple[int, float, float, int]]] = defaultdict(list)
    for task_id, attempt, start, end, pid in records:
        runs[task_id].append((attempt, start, end, pid))
    verdict.lost_records = sorted(task_ids - set(runs))
    per_attempt = Counter((task_id, attempt) for task_id, attempt, *_ in records)
    verdict.completed_twice_records = sorted(
        f"{task_id} attempt {attempt}" for (task_id, attempt), n in per_attempt.items() if n > 1
    )
    for task_id, task_runs in runs.items():
        ordered = sorted(task_runs, key=lambda run: run[1])
        latest = ordered[0]  # the run that ends last among those started so far
        for run in ordered[1:]:
            if run[1] < latest[2]:
                verdict.overlapped_records.append(f"{task_id} attempts {latest[0]}/{run[0]}")
            if run[2] > latest[2]:
                latest = run
    completed = {(row["task_id"], row["attempt"]) for row in db("completed_attempts")}
    verdict.unrecorded_completions = sorted(
        f"{task_id} attempt {attempt}"
        for task_id, attempt in completed
        if (task_id, attempt) not in per_attempt
    )
    rerun = sum(1 for task_runs in runs.values() if len(task_runs) > 1)
    return verdict, rerun


def _all_tasks(db: Callable[[str], list[dict[str, Any]]]) -> set[str]:
    return {row["task_id"] for row in db("task_ids")}


class ChaosRun:
    def __init__(self, config: ChaosConfig, say: Say) -> None:
        self.config = config
        self.say = say
        self.seed = config.seed if config.seed is not None else random.randrange(1 << 31)
        self.rng = random.Random(self.seed)
        self.tag = uuid.uuid4().hex
        self.record = config.run_dir / "operator-runs.txt"
        self.kills: Counter[str] = Counter()
        self.kills_by_process: Counter[str] = Counter()
        self.postgres_restarts = 0

    def run(self) -> ChaosResult:
        config = self.config
        config.run_dir.mkdir(parents=True, exist_ok=True)
        self.record.unlink(missing_ok=True)
        sqs: LocalSqs | None = None
        upstream = config.sqs_endpoint_url
        if upstream is None:
            sqs = LocalSqs(config.run_dir / "sqs", die_with_parent=True)
            upstream = sqs.start()
        try:
            injector = SqsFaultInjector(upstream, FaultRates(), seed=self.seed)
            with injector, DispatcherBalancer() as balancer:
                return self._run(injector, balancer)
        finally:
            if sqs is not None:
                sqs.stop()

    def _worker_env(self, balancer_url: str) -> dict[str, str]:
        env = {"TASKPLAT_WORKER_DISPATCHER_URL": balancer_url}
        if not self.config.waiting_claims:
            env.update(NO_WAITING_CLAIMS_ENV)
        return env

    def _stack_config(self, sqs_url: str, dispatcher_port: int, balancer_url: str) -> StackConfig:
        operators = self.config.run_dir / "operators.yaml"
        operators.write_text(OPERATORS_YAML.format(script=json.dumps(OPERATOR_SCRIPT)))
        env = {**STACK_ENV, "TASKPLAT_WORKER_OPERATORS_FILE": str(operators)}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        return StackConfig(
            run_dir=self.config.run_dir / "stack",
            workers=self.config.workers,
            dispatcher_port=dispatcher_port,
            service_env={"worker": self._worker_env(balancer_url)},
            sqs_endpoint_url=sqs_url,
            queue_prefix=f"chaos-{self.tag[:8]}-",
            dead_letter_queue=f"chaos-{self.tag[:8]}-dead-letters",
            keep_data=False,
            fsync=True,
            inherit_environment=False,
            env=env,
        )

    def _run(self, injector: SqsFaultInjector, balancer: DispatcherBalancer) -> ChaosResult:
        config = self.config
        self.say(
            f"chaos ({config.variant}): seed {self.seed}, {config.tasks} tasks, faults for "
            f"{config.fault_seconds:g}s, {config.replicas} replicas of each service"
        )
        port = free_port()
        balancer.set_upstreams([f"http://127.0.0.1:{port}"])
        stack = Stack(self._stack_config(injector.url, port, balancer.url))
        stack.start()
        conn_box: list[psycopg.Connection[dict[str, Any]]] = []
        try:
            self._add_replicas(stack, balancer)
            conn_box.append(
                psycopg.connect(stack.info.database_url, autocommit=True, row_factory=dict_row)
            )
            return self._drive(stack, injector, balancer, conn_box)
        finally:
            for conn in conn_box:
                conn.close()
            self.say("chaos: stopping the stack ...")
            stack.stop()

    def _add_replicas(self, stack: Stack, balancer: DispatcherBalancer) -> None:
        """The further replicas of each service; the balancer spreads over every dispatcher
        once each answers `/readyz`."""
        names = [
            stack.add_replica(service)
            for service in REPLICATED
            for _ in range(self.config.replicas - 1)
        ]
        dispatchers = ["dispatcher", *(n for n in names if n.startswith("dispatcher-"))]
        urls = [stack.ops_urls[name] for name in dispatchers]
        for url in urls[1:]:

            def ready(url: str = url) -> bool:
                try:
                    return httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for(ready, timeout=60, what=f"the dispatcher replica at {url}", interval=0.2)
        balancer.set_upstreams(urls)

    def _query(self, conn: psycopg.Connection[dict[str, Any]], name: str) -> list[dict[str, Any]]:
        sql: LiteralString = QUERIES[name]
        return conn.execute(sql, {"tag": self.tag}).fetchall()

    def _safe_query(
        self, stack: Stack, conn_box: list[psycopg.Connection[dict[str, Any]]], name: str
    ) -> list[dict[str, Any]] | None:
        """A query that survives Postgres restarts: None while the database is away."""
        try:
            return self._query(conn_box[0], name)
        except psycopg.OperationalError:
            try:
                conn_box[0].close()
                conn_box[0] = psycopg.connect(
                    stack.info.database_url,
                    autocommit=True,
                    row_factory=dict_row,
                    connect_timeout=2,
                )
            except psycopg.OperationalError:
                return None
            return None

    def _drive(
        self,
        stack: Stack,
        injector: SqsFaultInjector,
        balancer: DispatcherBalancer,
        conn_box: list[psycopg.Connection[dict[str, Any]]],
    ) -> ChaosResult:
        """Faults, submission, drain, verdict; `conn_box[0]` is the database connection (replaced
        after a Postgres restart)."""
        config = self.config
        run_key = uuid.uuid4().hex
        bodies = [
            {
                "operator": "chaos",
                "config": {"tag": self.tag, "record": str(self.record), "sleep": config.task_sleep},
                "max_attempts": 100,
                "idempotency_key": f"{run_key}-{n}",
            }
            for n in range(config.tasks)
        ]
        spread = config.fault_seconds * 0.6
        submitter = _Submitter(balancer.url, stack.info.api_key, bodies, spread, run_key)
        started = time.monotonic()
        window_end = started + config.fault_seconds
        restarts = sorted(
            started + self.rng.uniform(0.15, 0.85) * config.fault_seconds
            for _ in range(config.postgres_restarts)
        )
        next_kill = self._next_kill(started)
        injector.set_rates(config.rates)
        submitter.start()
        self.say(f"chaos: faults on ({_rates_text(config.rates)})")
        last_report = started
        while time.monotonic() < window_end or submitter.is_alive():
            now = time.monotonic()
            if submitter.error is not None:
                break
            if restarts and now >= restarts[0]:
                restarts.pop(0)
                self.say("chaos: Postgres: immediate stop and restart")
                stack.restart_postgres()
                self.postgres_restarts += 1
            elif next_kill is not None and now >= next_kill and now < window_end:
                self._kill_one(stack)
                next_kill = self._next_kill(now)
            if now - last_report >= 10:
                last_report = now
                progress = self._safe_query(stack, conn_box, "progress")
                if progress:
                    self.say(f"chaos: {progress[0]['completed']} of {config.tasks} completed")
            time.sleep(0.05)
        injector.set_rates(FaultRates())
        during = injector.counts
        if submitter.error is not None:
            raise DevstackError(f"submitting the tasks failed: {submitter.error}")
        submit_seconds = (submitter.finished_at or time.monotonic()) - started
        faults_off = time.monotonic()
        self.say(f"chaos: faults off after {faults_off - started:.1f}s; draining ...")
        drain_seconds, queue_empty, notes = self._drain(stack, conn_box, faults_off)

        def db(name: str) -> list[dict[str, Any]]:
            return self._query_fresh(stack, conn_box, name)

        task_ids = {row["task_id"] for row in db("task_ids")}
        records = _records(self.record)
        verdict, rerun = judge(records, task_ids | self._missing(task_ids), db)
        outcomes = {row["outcome"]: row["attempts"] for row in db("attempt_outcomes")}
        claims = balancer.claims
        completed_by_source = Counter(
            claims.get((row["task_id"], row["attempt"]), "unknown")
            for row in db("completed_attempts")
        )
        claims_by_source = Counter(claims.values())
        return ChaosResult(
            seed=self.seed,
            tasks=config.tasks,
            verdict=verdict,
            injected={k: v for k, v in injector.counts.items() if not k.startswith("action:")},
            sqs_requests={
                k.removeprefix("action:"): v for k, v in during.items() if k.startswith("action:")
            },
            kills=dict(self.kills),
            postgres_restarts=self.postgres_restarts,
            attempt_outcomes=outcomes,
            runs_recorded=len(records),
            tasks_run_more_than_once=rerun,
            submit_seconds=round(submit_seconds, 1),
            drain_seconds=drain_seconds,
            queue_empty=queue_empty,
            variant=config.variant,
            replicas=config.replicas,
            completed_by_source={k: completed_by_source.get(k, 0) for k in CLAIM_SOURCES},
            claims_by_source={k: claims_by_source.get(k, 0) for k in CLAIM_SOURCES[:-1]},
            wakeups_received=injector.counts.get("received", 0),
            balancer={
                k.replace("upstream:", "requests to "): v
                for k, v in balancer.counts.items()
                if not k.startswith("claimed:")
            },
            settings=self._settings(),
            kills_by_process=dict(self.kills_by_process),
            notes=notes,
        )

    def _settings(self) -> dict[str, str]:
        """The settings that decide which path a task takes (shown in the report)."""
        names = ("TASKPLAT_RELAY_HOLD_DEPTH", "TASKPLAT_DISPATCHER_POLLED_WAKEUP_DELAY_SECONDS")
        settings = {name: STACK_ENV[name] for name in names}
        settings["TASKPLAT_WORKER_POLL_DISPATCHER"] = (
            "true" if self.config.waiting_claims else "false"
        )
        settings["TASKPLAT_WORKER_CLAIM_AHEAD"] = "true" if self.config.waiting_claims else "false"
        return settings

    def _missing(self, task_ids: set[str]) -> set[str]:
        """Placeholders for submitted tasks the database does not hold (each one is lost)."""
        return {f"missing-{n}" for n in range(max(0, self.config.tasks - len(task_ids)))}

    def _query_fresh(
        self, stack: Stack, conn_box: list[psycopg.Connection[dict[str, Any]]], name: str
    ) -> list[dict[str, Any]]:
        def answer() -> tuple[list[dict[str, Any]]] | None:
            rows = self._safe_query(stack, conn_box, name)
            return None if rows is None else (rows,)

        answered = wait_for(answer, timeout=60, what=f"the database to answer {name}", interval=0.2)
        assert answered is not None
        return answered[0]

    def _next_kill(self, now: float) -> float | None:
        if self.config.kill_every <= 0:
            return None
        return now + self.rng.expovariate(1 / self.config.kill_every)

    def _kill_one(self, stack: Stack) -> None:
        running = stack.pids()
        candidates = [
            name
            for name in stack.services()
            if name in running and (_kind(name) in LOOPS or _kind(name) == "worker")
        ]
        if not candidates:
            return
        victim = self.rng.choice(sorted(candidates))
        try:
            stack.kill(victim, signal.SIGKILL)
        except DevstackError:
            return  # it died or is restarting already
        self.kills[_kind(victim)] += 1
        self.kills_by_process[victim] += 1
        self.say(f"chaos: SIGKILL {victim}")

    def _drain(
        self, stack: Stack, conn_box: list[psycopg.Connection[dict[str, Any]]], since: float
    ) -> tuple[float | None, bool, list[str]]:
        config = self.config
        deadline = since + config.drain_seconds
        notes: list[str] = []

        reported = [time.monotonic()]

        def every_10s(text: Callable[[], str]) -> None:
            if time.monotonic() - reported[0] >= 10:
                reported[0] = time.monotonic()
                self.say(text())

        def all_completed() -> bool:
            rows = self._safe_query(stack, conn_box, "progress")
            if rows:
                every_10s(lambda: f"chaos: {rows[0]['completed']} of {config.tasks} completed")
            return rows is not None and bool(rows) and rows[0]["completed"] == config.tasks

        try:
            wait_for(
                all_completed,
                timeout=max(deadline - time.monotonic(), 0.1),
                what="every task to complete",
                interval=0.2,
            )
        except TimeoutError:
            notes.append(f"not every task completed within {config.drain_seconds:g}s")
            return None, False, notes
        drained = round(time.monotonic() - since, 1)
        client = sqs_client(stack.info.sqs_endpoint_url, stack.config.aws_region)
        try:
            url = client.get_queue_url(QueueName=f"{stack.config.queue_prefix}default")["QueueUrl"]

            def queue_empty() -> bool:
                attributes = client.get_queue_attributes(
                    QueueUrl=url,
                    AttributeNames=[
                        "ApproximateNumberOfMessages",
                        "ApproximateNumberOfMessagesNotVisible",
                        "ApproximateNumberOfMessagesDelayed",
                    ],
                )["Attributes"]
                left = sum(int(v) for v in attributes.values())
                every_10s(lambda: f"chaos: every task completed; {left} wake-ups left in SQS")
                return left == 0

            try:
                wait_for(
                    queue_empty,
                    timeout=max(deadline - time.monotonic(), 30.0),
                    what="the task queue to empty",
                    interval=0.5,
                )
            except TimeoutError:
                notes.append("the task queue still held wake-ups at the end")
                return drained, False, notes
        finally:
            client.close()
        return drained, True, notes


def _kind(name: str) -> str:
    """The service a process runs: `dispatcher-2` -> `dispatcher`, `worker-1` -> `worker`."""
    return name.split("-", 1)[0]


def _rates_text(rates: FaultRates) -> str:
    return (
        f"lose {rates.lose:.0%}, duplicate {rates.duplicate:.0%}, "
        f"fail receive {rates.fail_receive:.0%}, fail delete {rates.fail_delete:.0%}"
    )


def report(result: ChaosResult, config: ChaosConfig) -> str:
    v = result.verdict
    injected = result.injected
    kills = ", ".join(f"{name} {n}" for name, n in sorted(result.kills.items())) or "none"
    outcomes = ", ".join(f"{k} {n}" for k, n in sorted(result.attempt_outcomes.items()))
    drained = f"{result.drain_seconds}s" if result.drain_seconds is not None else "not reached"
    by_source = result.completed_by_source
    lines = [
        f"chaos run ({result.variant}): {result.tasks} tasks, seed {result.seed}, faults for "
        f"{config.fault_seconds:g}s ({_rates_text(config.rates)}), {config.workers} workers, "
        f"{result.replicas} replicas of each service",
        "settings: " + ", ".join(f"{k}={v}" for k, v in result.settings.items()),
        f"injected: {injected.get('lost', 0)} messages lost, "
        f"{injected.get('duplicated', 0)} duplicated, "
        f"{injected.get('failed_receives', 0)} receives and "
        f"{injected.get('failed_deletes', 0)} deletes failed",
        "SQS requests during the faults: "
        + ", ".join(f"{name} {n}" for name, n in sorted(result.sqs_requests.items())),
        f"SIGKILLs: {kills}; Postgres immediate restarts: {result.postgres_restarts}",
        "SIGKILLs per process: "
        + (", ".join(f"{n} {k}" for n, k in sorted(result.kills_by_process.items())) or "none"),
        "dispatcher balancer: " + ", ".join(f"{k} {n}" for k, n in sorted(result.balancer.items())),
        f"submitted in {result.submit_seconds}s; every task Completed {drained} after the "
        f"faults stopped; task queue empty at the end: {'yes' if result.queue_empty else 'no'}",
        f"attempts: {outcomes}; operator runs recorded: {result.runs_recorded} "
        f"({result.tasks_run_more_than_once} tasks run more than once, allowed)",
        f"completed tasks claimed from an SQS wake-up {by_source.get('sqs', 0)}, by a waiting "
        f"claim {by_source.get('waiting_claim', 0)}, ahead {by_source.get('claim_ahead', 0)}, "
        f"unknown {by_source.get('unknown', 0)}; wake-ups SQS delivered: "
        f"{result.wakeups_received}",
        "",
        f"{'':34}{'database':>10}{'operators':>11}",
        f"{'tasks lost':34}{len(v.lost_db):>10}{len(v.lost_records):>11}",
        f"{'tasks completed twice':34}{len(v.completed_twice_db):>10}"
        f"{len(v.completed_twice_records):>11}",
        f"{'attempts that overlapped':34}{len(v.overlapped_db):>10}{len(v.overlapped_records):>11}",
        f"{'completions no operator recorded':34}{len(v.unrecorded_completions):>10}{'':>11}",
    ]
    for note in result.notes:
        lines.append(f"note: {note}")
    for name, items in asdict(v).items():
        if items:
            lines.append(f"{name}: {', '.join(items[:10])}{' ...' if len(items) > 10 else ''}")
    lines.append(f"result ({result.variant}): " + ("PASS" if v.ok else "FAIL"))
    return "\n".join(lines)


def comparison(results: list[ChaosResult]) -> str:
    """One column per variant: the verdict (database/operators) and the paths the tasks took."""

    def both(db: list[str], records: list[str]) -> str:
        return f"{len(db)}/{len(records)}"

    rows: list[tuple[str, list[str]]] = [
        ("tasks (replicas of each service)", [f"{r.tasks} ({r.replicas})" for r in results]),
        (
            "tasks lost (db/operators)",
            [both(r.verdict.lost_db, r.verdict.lost_records) for r in results],
        ),
        (
            "completed twice (db/operators)",
            [
                both(r.verdict.completed_twice_db, r.verdict.completed_twice_records)
                for r in results
            ],
        ),
        (
            "overlaps (db/operators)",
            [both(r.verdict.overlapped_db, r.verdict.overlapped_records) for r in results],
        ),
        ("unrecorded completions", [str(len(r.verdict.unrecorded_completions)) for r in results]),
    ]
    for source, label in (
        ("sqs", "completed via an SQS wake-up"),
        ("waiting_claim", "completed via a waiting claim"),
        ("claim_ahead", "completed via a claim ahead"),
        ("unknown", "completed via unknown"),
    ):
        rows.append((label, [str(r.completed_by_source.get(source, 0)) for r in results]))
    rows += [
        ("wake-ups SQS delivered", [str(r.wakeups_received) for r in results]),
        (
            "SQS sends lost/duplicated",
            [f"{r.injected.get('lost', 0)}/{r.injected.get('duplicated', 0)}" for r in results],
        ),
        (
            "SIGKILLs / Postgres restarts",
            [f"{sum(r.kills.values())}/{r.postgres_restarts}" for r in results],
        ),
        ("result", ["PASS" if r.verdict.ok else "FAIL" for r in results]),
    ]
    width = max(20, *(len(r.variant) + 2 for r in results))
    lines = [f"{'':34}" + "".join(f"{r.variant:>{width}}" for r in results)]
    lines += [
        f"{label:34}" + "".join(f"{cell:>{width}}" for cell in cells) for label, cells in rows
    ]
    return "\n".join(lines)


def variant_configs(config: ChaosConfig, variants: tuple[str, ...]) -> list[ChaosConfig]:
    """One config per variant, each in its own directory under `config.run_dir`, with the seed
    plus the variant's index in VARIANTS (so the variants draw different kill schedules, and a
    variant run alone replays the same one)."""
    unknown = [name for name in variants if name not in VARIANTS]
    if unknown or not variants:
        raise DevstackError(f"unknown chaos variant {unknown}: choose from {', '.join(VARIANTS)}")
    seed = config.seed
    return [
        replace(
            config,
            run_dir=config.run_dir / name,
            waiting_claims=name == WAITING_CLAIMS,
            seed=None if seed is None else seed + VARIANTS.index(name),
        )
        for name in variants
    ]


def main(
    config: ChaosConfig, say: Say | None = None, *, variants: tuple[str, ...] = VARIANTS
) -> int:
    """Run each variant (one after the other, seeds from one draw), print each report and the
    comparison, write `<run_dir>/chaos-summary.json`; 0 when every variant passed."""

    def default_say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    say = say or default_say
    seed = config.seed if config.seed is not None else random.randrange(1 << 31)
    config = replace(config, seed=seed)
    runs: list[tuple[ChaosConfig, ChaosResult, str]] = []
    for each in variant_configs(config, variants):
        result = ChaosRun(each, say).run()
        text = report(result, each)
        print(text + "\n", flush=True)
        each.run_dir.mkdir(parents=True, exist_ok=True)
        (each.run_dir / "chaos-summary.json").write_text(
            json.dumps(
                {"config": _config_json(each), "result": result.to_json(), "text": text}, indent=2
            )
        )
        runs.append((each, result, text))
    table = comparison([result for _, result, _ in runs])
    ok = all(result.verdict.ok for _, result, _ in runs)
    print(table + "\nresult: " + ("PASS" if ok else "FAIL"), flush=True)
    (config.run_dir / "chaos-summary.json").write_text(
        json.dumps(
            {
                "config": _config_json(config),
                "variants": {
                    result.variant: {
                        "config": _config_json(each),
                        "result": result.to_json(),
                        "text": text,
                    }
                    for each, result, text in runs
                },
                "comparison": table,
                "ok": ok,
            },
            indent=2,
        )
    )
    return 0 if ok else 1


def _config_json(config: ChaosConfig) -> dict[str, Any]:
    data = asdict(config)
    data["run_dir"] = str(config.run_dir)
    return data
