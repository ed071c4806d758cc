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

`taskplat.chaos.variants.main` runs the variants, each a `ChaosRun` with a fresh stack.

Invariants:
- Every random choice comes from `random.Random(seed)` (the injector has its own stream from the
  same seed); the seed is printed, so a run's schedule can be replayed (timing still differs).
- Processes (services, Postgres) are started and restarted from the calling thread only (their
  death signal is tied to it); the submitter thread only speaks HTTP.
- Faults and kills never continue into the drain: the drain measures convergence.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, LiteralString

import httpx
import psycopg
from psycopg.rows import dict_row

from taskplat.chaos.balancer import DispatcherBalancer
from taskplat.chaos.config import CLAIMS_AHEAD, VARIANT_ENV, ChaosConfig
from taskplat.chaos.drain import drain
from taskplat.chaos.injector import FaultRates, SqsFaultInjector
from taskplat.chaos.limits import check as check_limits
from taskplat.chaos.limits import set_on_queue
from taskplat.chaos.report import rates_text
from taskplat.chaos.submitter import Submitter
from taskplat.chaos.verdict import ChaosResult, judge, read_records
from taskplat.common.db.queries import load_queries
from taskplat.devstack.errors import DevstackError
from taskplat.devstack.ports import free_port
from taskplat.devstack.sqs import LocalSqs
from taskplat.devstack.stack import Stack, StackConfig
from taskplat.devstack.waiting import wait_for

QUERIES = load_queries("taskplat.chaos", "chaos.sql")
OPERATOR_SCRIPT = str(Path(__file__).with_name("recording_operator.py").absolute())
LOOPS = ("dispatcher", "relay", "scheduler", "reaper")  # with the worker wrappers: the victims
REPLICATED = ("dispatcher", "relay", "scheduler", "reaper", "sink")  # `replicas` of each
CLAIM_SOURCES = ("sqs", "waiting_claim", "claim_ahead", "unknown")
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
    # A stopping wrapper waits for its open waiting claim: as short as the SQS long poll, so the
    # final stop does not wait the default 10 s for it.
    "TASKPLAT_WORKER_POLL_WAIT_SECONDS": "2",
}
OPERATORS_YAML = """\
# Written by `make chaos`: the operator that records each run in its own file.
operators:
  chaos:
    command: ["{{python}}", {script}]
    mode: pooled
    pool_size: 8
"""


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
        env.update(VARIANT_ENV[self.config.variant])
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
        limits = config.limits
        bodies = [
            {
                "operator": "chaos",
                "config": {"tag": self.tag, "record": str(self.record), "sleep": config.task_sleep},
                "max_attempts": 100,
                "idempotency_key": f"{run_key}-{n}",
                **({"concurrency_key": limits.key_of(n)} if limits.keys else {}),
            }
            for n in range(config.tasks)
        ]
        if limits.any:
            set_on_queue(limits, balancer.url, stack.info.api_key)
            self.say(f"chaos: queue default limits {limits.body()}")
        spread = config.fault_seconds * 0.6
        submitter = Submitter(balancer.url, stack.info.api_key, bodies, spread, run_key)
        started = time.monotonic()
        window_end = started + config.fault_seconds
        restarts = sorted(
            started + self.rng.uniform(0.15, 0.85) * config.fault_seconds
            for _ in range(config.postgres_restarts)
        )
        next_kill = self._next_kill(started)
        injector.set_rates(config.rates)
        submitter.start()
        self.say(f"chaos: faults on ({rates_text(config.rates)})")
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
        drain_seconds, queue_empty, notes = drain(
            config,
            stack,
            lambda: self._safe_query(stack, conn_box, "progress"),
            self.say,
            faults_off,
        )

        def db(name: str) -> list[dict[str, Any]]:
            return self._query_fresh(stack, conn_box, name)

        task_ids = {row["task_id"] for row in db("task_ids")}
        records = read_records(self.record)
        verdict, rerun = judge(records, task_ids | self._missing(task_ids), db)
        limits_use: dict[str, Any] = {}
        if limits.any:
            limits_use, verdict.limits_exceeded = check_limits(limits, db("attempt_intervals"))
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
            limits_use=limits_use,
        )

    def _settings(self) -> dict[str, str]:
        """The settings that decide which path a task takes (shown in the report)."""
        names = ("TASKPLAT_RELAY_HOLD_DEPTH", "TASKPLAT_DISPATCHER_POLLED_WAKEUP_DELAY_SECONDS")
        settings = {name: STACK_ENV[name] for name in names}
        settings["TASKPLAT_WORKER_POLL_DISPATCHER"] = (
            "true" if self.config.waiting_claims else "false"
        )
        settings["TASKPLAT_WORKER_CLAIM_AHEAD"] = (
            "unset"
            if self.config.waiting_claims
            else "true"
            if self.config.variant == CLAIMS_AHEAD
            else "false"
        )
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


def _kind(name: str) -> str:
    """The service a process runs: `dispatcher-2` -> `dispatcher`, `worker-1` -> `worker`."""
    return name.split("-", 1)[0]
