"""`make bench`: for each variant, start the bench's stacks, run the chosen workloads N times,
combine the runs into medians, print the table and write the results.

Invariants:
- Each variant runs on stacks of its own (fresh databases): W1, W7, W2, W4 and W3 with the
  main stack's lease TTL share the variant's main stack, in that order (a warm-up first, W7 right
  after W1 so its drain compares with W1's on the same database, W4's prefill after W1 and W2,
  W3's kills last); W3 with any other lease TTL gets a stack of its own,
  started with that TTL. Every stack is stopped however the bench ends.
- A workload that fails is recorded under the variant's `errors` and the bench goes on with
  the next one; the exit status is 1 when anything failed or a figure is missing. Ctrl-C stops
  the stacks and writes nothing.
- The result record (see `report.py`) keeps every run of every workload and variant beside
  the medians, the machine and the settings.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from tqdm import tqdm

from taskplat.bench import machine
from taskplat.bench.buffered import measure_buffered
from taskplat.bench.config import LEASE_TTL, BenchConfig, Variant
from taskplat.bench.floor import measure_floor
from taskplat.bench.flow import measure_flow
from taskplat.bench.harness import BenchStack
from taskplat.bench.peers import checkout_root, compare, load_results, run_harness
from taskplat.bench.peers import render_lines as render_peer_lines
from taskplat.bench.query import measure_query
from taskplat.bench.recovery import measure_recovery
from taskplat.bench.report import (
    ONE_WRAPPER,
    missing_figures,
    render_table,
    ttl_key,
    write_results,
)
from taskplat.bench.stats import combine
from taskplat.bench.throughput import (
    find_batch_path,
    measure_latency,
    measure_throughput,
    prefill,
    warm_up,
)
from taskplat.devstack.errors import DevstackError

Record = dict[str, Any]
# W2's second run, at this fraction of its rate: the path alone, with the cores nearly idle.
UNLOADED_RATE_DIVISOR = 10

_FAILURES = (DevstackError, TimeoutError, psycopg.Error, OSError)


def say(message: str) -> None:
    tqdm.write(f"bench: {message}", file=sys.stderr)


class _VariantRun:
    def __init__(self, config: BenchConfig, variant: Variant, record: Record) -> None:
        self.config = config
        self.variant = variant
        self.record = record
        self.runs: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.setup: dict[str, Any] = {}

    def attempt(self, name: str, body: Callable[[], None]) -> None:
        try:
            body()
        except _FAILURES as exc:
            say(f"[{self.variant.name}] {name} failed: {exc}")
            self.errors[name] = f"{type(exc).__name__}: {exc}"

    def label(self, workload: str, run: int, extra: str = "") -> str:
        return f"[{self.variant.name}] {workload}{extra} run {run}/{self.config.runs}"

    def run(self) -> Record:
        config, variant = self.config, self.variant
        env = config.stack_env(variant)
        main_ttl = float(env[LEASE_TTL])
        ttls = config.sizes.w3_lease_ttls if "W3" in config.workloads else ()
        own_ttls = [ttl for ttl in ttls if ttl != main_ttl]
        needs_main = (
            any(w in config.workloads for w in ("W1", "W2", "W4", "W5", "W6", "W7"))
            or main_ttl in ttls
        )
        base = config.run_dir / variant.name
        if needs_main:
            try:
                with BenchStack(
                    base / "main",
                    env,
                    workers=config.workers,
                    say=say,
                    data_services="W6" in config.workloads,
                ) as bs:
                    self._describe(bs)
                    self._on_main(bs, main_ttl in ttls)
            except _FAILURES as exc:
                say(f"[{variant.name}] the main stack failed: {exc}")
                self.errors["main stack"] = f"{type(exc).__name__}: {exc}"
        for ttl in own_ttls:
            extra = {**env, LEASE_TTL: f"{ttl:g}"}
            try:
                with BenchStack(
                    base / f"lease-{ttl:g}s", extra, workers=config.workers, say=say
                ) as bs:
                    self._describe(bs)
                    self._w3_on(bs)
            except _FAILURES as exc:
                say(f"[{variant.name}] the lease {ttl:g}s stack failed: {exc}")
                self.errors[f"W3 lease {ttl:g}s"] = f"{type(exc).__name__}: {exc}"
        if ttls and self.config.sizes.w3_one_wrapper and self.config.workers != 1:
            for ttl in ttls:
                extra = {**env, LEASE_TTL: f"{ttl:g}"}
                name = f"W3 lease {ttl:g}s one wrapper"
                try:
                    with BenchStack(
                        base / f"lease-{ttl:g}s-one-wrapper", extra, workers=1, say=say
                    ) as bs:
                        self._describe(bs)
                        self._w3_one_wrapper(bs, name)
                except _FAILURES as exc:
                    say(f"[{variant.name}] the one-wrapper lease {ttl:g}s stack failed: {exc}")
                    self.errors[name] = f"{type(exc).__name__}: {exc}"
        return self._result()

    def _describe(self, bs: BenchStack) -> None:
        """Record the machine once, from the first stack that runs."""
        if self.record.get("machine") is None:
            described = machine.describe(bs.database_url, bs.directory)
            described["sqs_server"] = bs.sqs_log.kind if bs.sqs_log else None
            self.record["machine"] = described

    def _on_main(self, bs: BenchStack, w3_here: bool) -> None:
        config = self.config
        batch_path = None
        if config.submit != "single":
            batch_path = find_batch_path(bs)
            if batch_path is None and config.submit == "batch":
                raise DevstackError("--submit batch: the dispatcher has no bulk create route")
        self.setup["submit"] = (
            f"POST {batch_path} ({config.sizes.batch_size} tasks per request)"
            if batch_path
            else "POST /tasks (one task per request)"
        ) + f", {config.sizes.in_flight} requests in flight"
        if any(w in config.workloads for w in ("W1", "W2", "W4", "W7")):
            say(f"[{self.variant.name}] warming up ...")
            self.setup["warm_up"] = warm_up(bs, config.sizes, batch_path, "warm-up")
        if "W1" in config.workloads:
            self.attempt("W1", lambda: self._throughput(bs, "W1", batch_path))
        if "W7" in config.workloads:
            self.attempt("W7", lambda: self._w7(bs, batch_path))
        if "W2" in config.workloads:
            self.attempt("W2", lambda: self._w2(bs))
        if "W4" in config.workloads:
            self.attempt("W4", lambda: self._w4(bs, batch_path))
        if "W5" in config.workloads:
            self.attempt("W5", lambda: self._w5(bs))
        if "W6" in config.workloads:
            self.attempt("W6", lambda: self._w6(bs))
        if w3_here:
            self._w3_on(bs)

    def _throughput(self, bs: BenchStack, workload: str, batch_path: str | None) -> None:
        runs = self.runs.setdefault(workload, [])
        for number in range(1, self.config.runs + 1):
            label = self.label(workload, number)
            figures = measure_throughput(
                bs, self.config.sizes, batch_path, label, blocks=self.config.postgres_blocks
            )
            if workload == "W1":
                figures["memory_peak_mib"] = bs.peak_rss()
            runs.append(figures)
            say(
                f"{label}: submit {figures['submit_rate']:,.0f}/s, drain "
                f"{figures['drain_rate']:,.0f}/s, {figures['sqs_requests_per_task']:.3f} SQS "
                f"requests/task, exactly once: {'yes' if figures['exactly_once'] else 'NO'}"
            )

    def _w7(self, bs: BenchStack, batch_path: str | None) -> None:
        runs = self.runs.setdefault("W7", [])
        sizes = self.config.sizes
        self.setup["W7"] = (
            f"queue default: W1's drain under limits that never bind; {sizes.w7_key_tasks} "
            f"tasks of {sizes.w7_hold_seconds:g}s on {sizes.w7_keys} keys "
            f"({sizes.w7_hot_share:.0%} on one, queued first) under key_concurrency_limit "
            f"{sizes.w7_key_limit}; "
            f"{sizes.w7_rate_tasks} tasks at once under rate_limit {sizes.w7_rate:g}/s burst "
            f"{sizes.w7_burst}"
        )
        for number in range(1, self.config.runs + 1):
            label = self.label("W7", number)
            figures = measure_flow(bs, sizes, batch_path, label)
            runs.append(figures)
            keys, rate = figures["keys"], figures["rate"]
            key_text = (
                f"max Running per key {keys['max_running_of_a_key']} (limit "
                f"{keys['key_limit']}), limit exceeded: "
                f"{'no' if keys['key_limit_held'] else 'YES'}, shares while all have work "
                f"{keys['share_of_starts_while_all_have_work']}"
                if keys["measured"]
                else f"keys not measured ({keys['reason']})"
            )
            say(
                f"{label}: drain under unbinding limits {figures['unbinding']['drain_rate']:,.0f}"
                f"/s; {key_text}; rate {rate['starts_per_second']} starts/s against "
                f"{rate['limit_per_second']:g}/s, over rate: "
                f"{'no' if rate['rate_held'] else 'YES'}"
            )

    def _w2(self, bs: BenchStack) -> None:
        runs = self.runs.setdefault("W2", [])
        for number in range(1, self.config.runs + 1):
            label = self.label("W2", number)
            sizes = self.config.sizes
            # The transport floor first, in the same run: a plain client through the same SQS.
            floor = measure_floor(bs, n=sizes.w2_tasks, rate=sizes.w2_rate)
            # Fresh wrappers, whose `lat` operator has served nothing yet: the first tasks of a
            # new deployment count too.
            bs.restart_workers()
            figures = measure_latency(bs, sizes, label)
            figures["floor"] = floor
            for p in ("p50", "p99"):
                if floor[f"{p}_ms"] > 0:
                    figures[f"{p}_ratio_to_floor"] = round(figures[f"{p}_ms"] / floor[f"{p}_ms"], 2)
            # The same path at a tenth of the rate: the stack nearly idle, so what is left is
            # the path itself, not the wait for a busy core.
            unloaded = measure_latency(
                bs,
                sizes,
                f"{label} unloaded",
                tasks=max(10, sizes.w2_tasks // 5),
                rate=sizes.w2_rate / UNLOADED_RATE_DIVISOR,
            )
            figures["unloaded"] = {
                key: unloaded[key] for key in ("tasks", "rate", "p50_ms", "p99_ms", "stages_p50_ms")
            }
            runs.append(figures)
            say(
                f"{label}: p50 {figures['p50_ms']:.1f} ms, p95 {figures['p95_ms']:.1f} ms, "
                f"p99 {figures['p99_ms']:.1f} ms at {figures['rate']:.0f}/s; SQS floor p50 "
                f"{floor['p50_ms']:.1f} ms, p99 {floor['p99_ms']:.1f} ms; at "
                f"{unloaded['rate']:.0f}/s p50 {unloaded['p50_ms']:.1f} ms"
            )

    def _w4(self, bs: BenchStack, batch_path: str | None) -> None:
        self.setup["W4_prefill"] = prefill(bs, self.config.sizes.w4_rows)
        self._throughput(bs, "W4", batch_path)

    def _w5(self, bs: BenchStack) -> None:
        runs = self.runs.setdefault("W5", [])
        if not any(name.startswith("sink-") for name in bs.running().services()):
            bs.running().add_replica("sink")  # two sink replicas
            bs.running().wait_running("sink-2", timeout=60)
        self.setup["W5"] = "two sink replicas; records published with plain SendMessageBatch"
        for number in range(1, self.config.runs + 1):
            label = self.label("W5", number)
            figures = measure_buffered(bs, self.config.sizes, label)
            runs.append(figures)
            say(
                f"{label}: {figures['records_per_second']:,.0f} records/s, publish-to-routed "
                f"p99 {figures['p99_publish_to_routed_ms']:.0f} ms, exactly once: "
                f"{'yes' if figures['exactly_once'] else 'NO'}"
            )

    def _w6(self, bs: BenchStack) -> None:
        runs = self.runs.setdefault("W6", [])
        sizes = self.config.sizes
        self.setup["W6"] = (
            f"a GROUP BY aggregate of a {sizes.w6_rows}-row buffered dataset through POST /query: "
            f"{sizes.w6_sequential} sequential with one capability token, then "
            f"{sizes.w6_queries} from {' and '.join(map(str, sizes.w6_clients))} clients each "
            "with a token of its own; the same statement straight on Postgres (psycopg) as the "
            "floor"
        )
        for number in range(1, self.config.runs + 1):
            label = self.label("W6", number)
            figures = measure_query(bs, sizes, label)
            runs.append(figures)
            rates = ", ".join(
                f"{figures[f'queries_per_second_{n}']:.1f} queries/s with {n} clients"
                for n in sizes.w6_clients
            )
            say(
                f"{label}: sequential p50 {figures['sequential_p50_ms']:.1f} ms, p90 "
                f"{figures['sequential_p90_ms']:.1f} ms, p99 {figures['sequential_p99_ms']:.1f} "
                f"ms; {rates}; {figures['cpu_ms_per_query']:.1f} ms of query-service CPU per "
                f"query; Postgres p50 {figures['postgres_p50_ms']:.2f} ms"
            )

    def _w3_on(self, bs: BenchStack) -> None:
        self.attempt(f"W3 lease {bs.lease_ttl:g}s", lambda: self._w3(bs))

    def _w3_one_wrapper(self, bs: BenchStack, name: str) -> None:
        self.attempt(name, lambda: self._w3(bs, ONE_WRAPPER))

    def _w3(self, bs: BenchStack, suffix: str = "") -> None:
        key = ttl_key(bs.lease_ttl) + suffix
        runs = self.runs.setdefault("W3", {}).setdefault(key, [])
        sizes = self.config.sizes
        for number in range(1, self.config.runs + 1):
            extra = f" lease {bs.lease_ttl:g}s" + (" one wrapper" if suffix else "")
            label = self.label("W3", number, extra)
            figures = measure_recovery(
                bs,
                sleep_seconds=sizes.w3_sleep_seconds,
                kill_after=sizes.w3_kill_after_seconds,
                label=label,
            )
            runs.append(figures)
            say(
                f"{label}: re-started {figures['recovery_seconds']:.2f}s after the kill, "
                f"completed once: {'yes' if figures['completed_once'] else 'NO'}, operator "
                f"died: {'yes' if figures['operator_died_with_wrapper'] else 'NO'}"
            )

    def _result(self) -> Record:
        figures: dict[str, Any] = {}
        for workload in ("W1", "W2", "W4", "W5", "W6", "W7"):
            if self.runs.get(workload):
                figures[workload] = combine(self.runs[workload])
        if self.runs.get("W3"):
            figures["W3"] = {key: combine(runs) for key, runs in self.runs["W3"].items() if runs}
        if "W1" in figures:
            figures["memory"] = figures["W1"].pop("memory_peak_mib", {})
            if "W4" in figures:
                for name, ratio in (("drain_rate", "drain"), ("submit_rate", "submit")):
                    w1, w4 = figures["W1"].get(name), figures["W4"].get(name)
                    if w1 and w4:
                        figures["W4"][f"{ratio}_ratio_to_W1"] = round(w4 / w1, 3)
            unbinding = figures.get("W7", {}).get("unbinding", {})
            if figures["W1"].get("drain_rate") and unbinding.get("drain_rate"):
                ratio = unbinding["drain_rate"] / figures["W1"]["drain_rate"]
                unbinding["drain_ratio_to_W1"] = round(ratio, 3)
        return {
            "name": self.variant.name,
            "env": dict(self.variant.env),
            "setup": self.setup,
            "figures": figures,
            "runs": self.runs,
            "errors": self.errors,
        }


def run_bench(config: BenchConfig) -> tuple[Record, int]:
    """Run every variant; return the record and the exit status (0: complete)."""
    started = time.monotonic()
    record: Record = {
        "schema": 1,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": config.as_record(),
        "machine": None,
        "variants": [],
    }
    for variant in config.variants:
        say(f"variant {variant.name}: {dict(variant.env) or 'no overrides'}")
        record["variants"].append(_VariantRun(config, variant, record).run())
    if config.peers_harness is not None:
        record["peers"] = _against_peers(config)
    record["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    record["duration_seconds"] = round(time.monotonic() - started, 1)
    record["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    missing = missing_figures(record)
    record["missing_figures"] = missing
    return record, 1 if missing or any(v["errors"] for v in record["variants"]) else 0


def _against_peers(config: BenchConfig) -> dict[str, Any]:
    """Run the side-by-side harness (see `peers`); its failure is recorded, not raised."""
    assert config.peers_harness is not None
    log = config.run_dir / "peers.log"
    say(f"peers: running the side-by-side harness in {config.peers_harness} (log: {log}) ...")
    try:
        folder = run_harness(
            config.peers_harness,
            checkout_root(),
            log,
            reps=config.runs,
            tasks=config.sizes.w1_tasks,
        )
        return {"results": str(folder), **compare(load_results(folder))}
    except (DevstackError, OSError, ValueError) as exc:
        say(f"peers: not measured: {exc}")
        return {"error": str(exc)}


def main(config: BenchConfig) -> int:
    record, status = run_bench(config)
    json_path, md_path = write_results(record, config.results_dir)
    print(render_table(record), flush=True)
    if "peers" in record:
        print("\n".join(render_peer_lines(record["peers"])), flush=True)
    say(f"{record['duration_seconds']:.0f}s in all; results in {json_path} and {md_path}")
    for name in record["missing_figures"]:
        say(f"missing: {name}")
    return status
