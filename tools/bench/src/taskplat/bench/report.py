"""The benchmark's outputs: the console table, `latest.json` and `latest.md`.

Invariants:
- Every figure of `figure_rows` is looked up in a variant's median tree (`figures`) by path; a
  cell shows the median and, over several runs, the (min..max) range of the runs.
- `missing_figures` names every figure a complete result of the chosen workloads must hold,
  so a test (and the lead) can tell a partial result from a complete one.
- The JSON holds everything (every run of every variant, the machine, the settings); the table
  and the Markdown are views of it. Files are written whole (temp file, then rename).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskplat.bench.peers import render_lines as render_peer_lines
from taskplat.bench.stats import spread

SERVICES = ("dispatcher", "relay", "scheduler", "reaper")


@dataclass(frozen=True)
class Row:
    label: str
    path: tuple[str, ...]
    unit: str = ""
    target: str = ""
    digits: int = 1
    # False: printed when measured, but its absence does not make a result incomplete.
    required: bool = True


ONE_WRAPPER = "_one_wrapper"


def ttl_key(ttl: float) -> str:
    return f"lease_ttl_{ttl:g}s"


def figure_rows(
    workloads: Sequence[str], ttls: Sequence[float], workers: int, *, one_wrapper: bool = False
) -> list[Row]:
    rows: list[Row] = []
    if "W1" in workloads:
        rows += [
            Row("W1 submit rate", ("W1", "submit_rate"), "tasks/s", digits=0),
            Row("W1 drain rate", ("W1", "drain_rate"), "tasks/s", ">= 650", 0),
            Row("W1 SQS requests per task", ("W1", "sqs_requests_per_task"), "", "<= 0.3", 3),
            Row("W1 every task completed exactly once", ("W1", "exactly_once"), "", "yes"),
            Row(
                "W1 scheduler re-publications per task",
                ("W1", "republished_per_task"),
                "",
                "< 0.01",
                4,
                required=False,
            ),
        ]
    if "W2" in workloads:
        rows += [
            Row(
                "W2 SQS floor p50 (plain client, same endpoint)",
                ("W2", "floor", "p50_ms"),
                "ms",
                required=False,
            ),
            Row(
                "W2 SQS floor p99 (plain client, same endpoint)",
                ("W2", "floor", "p99_ms"),
                "ms",
                required=False,
            ),
            Row("W2 enqueue-to-start p50", ("W2", "p50_ms"), "ms", "<= floor + 4"),
            Row("W2 enqueue-to-start p95", ("W2", "p95_ms"), "ms"),
            Row("W2 enqueue-to-start p99", ("W2", "p99_ms"), "ms", "<= 25"),
            Row(
                "W2 p50 at a tenth of the rate (the path without waiting for a core)",
                ("W2", "unloaded", "p50_ms"),
                "ms",
                required=False,
            ),
            Row("W2 p50 / floor p50", ("W2", "p50_ratio_to_floor"), "", digits=2, required=False),
            Row("W2 p99 / floor p99", ("W2", "p99_ratio_to_floor"), "", digits=2, required=False),
        ]
    if "W3" in workloads:
        for ttl in ttls:
            key = ttl_key(ttl)
            rows += [
                Row(
                    f"W3 lease {ttl:g}s: kill to re-start",
                    ("W3", key, "recovery_seconds"),
                    "s",
                    f"<= {ttl + 2:g}",
                    2,
                ),
                Row(f"W3 lease {ttl:g}s: completed once", ("W3", key, "completed_once"), "", "yes"),
                Row(
                    f"W3 lease {ttl:g}s: operator died with wrapper",
                    ("W3", key, "operator_died_with_wrapper"),
                    "",
                    "yes",
                ),
            ]
        if one_wrapper:
            for ttl in ttls:
                key = ttl_key(ttl) + ONE_WRAPPER
                rows += [
                    Row(
                        f"W3 one wrapper, lease {ttl:g}s: kill to re-start",
                        ("W3", key, "recovery_seconds"),
                        "s",
                        f"<= {ttl + 2:g}",
                        2,
                        required=False,
                    ),
                    Row(
                        f"W3 one wrapper, lease {ttl:g}s: completed once",
                        ("W3", key, "completed_once"),
                        "",
                        "yes",
                        required=False,
                    ),
                ]
    if "W4" in workloads:
        rows += [
            Row("W4 submit rate", ("W4", "submit_rate"), "tasks/s", digits=0),
            Row("W4 drain rate", ("W4", "drain_rate"), "tasks/s", digits=0),
            Row("W4 drain rate / W1", ("W4", "drain_ratio_to_W1"), "", ">= 0.90", 2),
            Row("W4 SQS requests per task", ("W4", "sqs_requests_per_task"), "", "<= 0.3", 3),
            Row("W4 every task completed exactly once", ("W4", "exactly_once"), "", "yes"),
        ]
    if "W5" in workloads:
        rows += [
            Row("W5 records through two sinks", ("W5", "records_per_second"), "records/s",
                ">= 5000", 0),
            Row("W5 publish-to-routed p50", ("W5", "p50_publish_to_routed_ms"), "ms", digits=0),
            Row("W5 publish-to-routed p99", ("W5", "p99_publish_to_routed_ms"), "ms", digits=0),
            Row("W5 every record written exactly once", ("W5", "exactly_once"), "", "yes"),
        ]  # fmt: skip
    if "W6" in workloads:
        rows += [
            Row("W6 sequential p50 (1,000-row aggregate)", ("W6", "sequential_p50_ms"), "ms",
                "<= 25", 1),
            Row("W6 sequential p90", ("W6", "sequential_p90_ms"), "ms", digits=1),
            Row("W6 sequential p99", ("W6", "sequential_p99_ms"), "ms", digits=1),
            Row("W6 queries per second, 4 clients", ("W6", "queries_per_second_4"), "queries/s",
                ">= 40", 1, required=False),
            Row("W6 queries per second, 16 clients", ("W6", "queries_per_second_16"),
                "queries/s", digits=1, required=False),
            Row("W6 queries per second (first client count)", ("W6", "queries_per_second"),
                "queries/s", digits=1),
            Row("W6 query-service CPU per query", ("W6", "cpu_ms_per_query"), "ms", "<= 15", 1),
            Row("W6 same statement on Postgres p50", ("W6", "postgres_p50_ms"), "ms", digits=2),
            Row("W6 sequential p50 / Postgres p50", ("W6", "p50_over_postgres"), "", digits=1),
        ]  # fmt: skip
    if "W7" in workloads:
        rows += [
            Row("W7 drain under unbinding limits", ("W7", "unbinding", "drain_rate"), "tasks/s",
                digits=0),
            Row("W7 drain under unbinding limits / W1", ("W7", "unbinding", "drain_ratio_to_W1"),
                "", ">= 0.90", 2, required="W1" in workloads),
            Row("W7 most Running of one key", ("W7", "keys", "max_running_of_a_key"), "tasks",
                digits=0),
            Row("W7 key limit never exceeded", ("W7", "keys", "key_limit_held"), "", "yes"),
            Row("W7 rate-limited starts per second", ("W7", "rate", "starts_per_second"),
                "starts/s", digits=1),
            Row("W7 rate limit's bucket never exceeded", ("W7", "rate", "rate_held"), "", "yes"),
        ]  # fmt: skip
    if "W1" in workloads:
        names = [*SERVICES, *(f"worker-{i}" for i in range(1, workers + 1))]
        for name in names:
            target = "<= 150" if name == "dispatcher" else ""
            rows.append(Row(f"peak RSS {name} (W1)", ("memory", name), "MiB", target, 0))
    return rows


def _lookup(tree: Mapping[str, Any], path: Sequence[str]) -> Any:
    node: Any = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def _runs_for(variant: Mapping[str, Any], path: Sequence[str]) -> list[Mapping[str, Any]]:
    """The per-run trees that hold `path` (W3's runs are kept per lease TTL)."""
    runs = variant.get("runs", {})
    head = path[0]
    if head == "memory":
        return [{"memory": run.get("memory_peak_mib", {})} for run in runs.get("W1", [])]
    if head == "W3":
        return [{"W3": {path[1]: run}} for run in runs.get("W3", {}).get(path[1], [])]
    return [{head: run} for run in runs.get(head, [])]


def cell(variant: Mapping[str, Any], row: Row) -> str:
    value = _lookup(variant.get("figures", {}), row.path)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, int | float):
        text = f"{value:,.{row.digits}f}"
        runs = _runs_for(variant, row.path)
        bounds = spread(runs, row.path) if len(runs) > 1 else None
        if bounds is not None and bounds[0] != bounds[1]:
            text += f" ({bounds[0]:,.{row.digits}f}..{bounds[1]:,.{row.digits}f})"
        return text
    return str(value)


def _rows_of(record: Mapping[str, Any]) -> list[Row]:
    settings = record["settings"]
    return figure_rows(
        settings["workloads"],
        settings["sizes"]["w3_lease_ttls"],
        settings["worker_wrappers"],
        one_wrapper=bool(settings["sizes"].get("w3_one_wrapper"))
        and settings["worker_wrappers"] != 1,
    )


def table_cells(record: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    variants = record["variants"]
    header = ["figure", "unit", "target", *(v["name"] for v in variants)]
    body = [
        [row.label, row.unit, row.target, *(cell(v, row) for v in variants)]
        for row in _rows_of(record)
    ]
    return header, body


def render_table(record: Mapping[str, Any]) -> str:
    header, body = table_cells(record)
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(text.ljust(width) for text, width in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * width for width in widths))
    lines += [
        "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True))
        for line in body
    ]
    return "\n".join(lines)


def missing_figures(record: Mapping[str, Any]) -> list[str]:
    """`<variant>: <figure>` for every figure of the table that has no value."""
    missing = []
    for variant in record["variants"]:
        for row in _rows_of(record):
            if not row.required:
                continue
            if row.path[0] == "memory" and row.path[1] not in variant.get("figures", {}).get(
                "memory", {}
            ):
                value = None
            else:
                value = _lookup(variant.get("figures", {}), row.path)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                missing.append(f"{variant['name']}: {row.label}")
    return missing


def _md_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(line) + " |" for line in body]
    return lines


def _cpu_lines(variant: Mapping[str, Any], workload: str, cores: int) -> list[str]:
    figures = variant.get("figures", {})
    cpu = _lookup(figures, (workload, "cpu_seconds"))
    wall = _lookup(figures, (workload, "cpu_wall_seconds"))
    tasks = _lookup(figures, (workload, "tasks"))
    if not cpu or not wall or not tasks:
        return []
    total = sum(cpu.values())

    def row(name: str, seconds: float, share: str) -> list[str]:
        return [name, f"{seconds:.2f}", f"{1000 * seconds / tasks:.2f}", share]

    body = [
        row(name, seconds, f"{100 * seconds / total:.0f}%")
        for name, seconds in sorted(cpu.items(), key=lambda item: -item[1])
    ]
    body.append(row("total", total, f"{100 * total / (wall * cores):.0f}% of {cores} cores"))
    return [
        f"CPU during {workload} ({tasks:g} tasks; median of each process over the runs; "
        f"{wall:.1f}s from the first request to the last completion):",
        "",
        *_md_table(["process", "CPU seconds", "ms per task", "share"], body),
        "",
    ]


def _machine_line(machine: Mapping[str, Any]) -> str:
    postgres = machine.get("postgres") or {}
    durability = ", ".join(
        f"{name}={postgres[name]}"
        for name in ("fsync", "synchronous_commit", "full_page_writes")
        if name in postgres
    )
    parts = [
        f"{machine.get('cores')} cores ({machine.get('usable_cores')} usable)",
        f"{machine.get('memory_gib')} GiB",
        str(machine.get("cpu_model")),
        str(machine.get("os")),
        f"Python {machine.get('python')}",
        f"PostgreSQL {postgres.get('version', '?')} ({durability})",
        f"8 kB write + fdatasync {machine.get('fdatasync_ms')} ms",
        f"SQS server {machine.get('sqs_server')}",
        f"load average at start {machine.get('load_average_at_start')}",
    ]
    return ", ".join(parts)


def _commit_line(git: Mapping[str, Any]) -> str:
    if not git.get("commit"):
        return "not a git checkout"
    dirty = " plus uncommitted changes" if git.get("dirty") else ""
    return f"commit {git['commit']}{dirty}"


def render_markdown(record: Mapping[str, Any]) -> str:
    machine = record.get("machine") or {}
    header, body = table_cells(record)
    settings = record["settings"]
    lines = [
        "# Taskplat benchmark",
        "",
        f"Run {record['started_at']} with `{' '.join(settings['command']) or 'make bench'}`; "
        f"{record['duration_seconds']:.0f}s in all. Each figure is the median of "
        f"{settings['runs']} run(s); the range of the runs is in parentheses. Load average "
        f"at the end: {record.get('load_average_at_end')} (other work on the machine changes "
        "every figure).",
        "",
        f"Machine: {_machine_line(machine)}.",
        "",
        f"Code: {_commit_line(machine.get('git') or {})}.",
        "",
        *_md_table(header, body),
        "",
    ]
    cores = int(machine.get("usable_cores") or machine.get("cores") or 1)
    for variant in record["variants"]:
        lines += [f"## Variant `{variant['name']}`", ""]
        env = variant.get("env") or {}
        lines.append("Overrides: " + (", ".join(f"`{k}={v}`" for k, v in env.items()) or "none"))
        setup = variant.get("setup", {})
        lines += ["", f"Submission: {setup.get('submit', '?')}", ""]
        if setup.get("warm_up"):
            lines += [f"Warm-up before the first run: {json.dumps(setup['warm_up'])}", ""]
        for path, when in ((("W2",), ""), (("W2", "unloaded"), " at a tenth of the rate")):
            stages = _lookup(variant.get("figures", {}), (*path, "stages_p50_ms"))
            if stages:
                text = ", ".join(
                    f"{name} {value:.0%}"
                    if name == "claimed_without_wakeup"
                    else f"{name} {value:.1f} ms"
                    for name, value in stages.items()
                )
                lines += [f"W2 enqueue-to-start by stage{when} (median of each): {text}", ""]
        for workload in ("W1", "W2", "W4"):
            by_op = _lookup(variant.get("figures", {}), (workload, "sqs_requests_by_op"))
            source = _lookup(variant.get("figures", {}), (workload, "sqs_requests_source"))
            if by_op:
                ops = ", ".join(f"{op} {count:g}" for op, count in by_op.items())
                lines += [
                    f"SQS requests during {workload}: the table's figure is from the {source}; "
                    f"the SQS server logged (median per operation) {ops}",
                    "",
                ]
            calls = _lookup(variant.get("figures", {}), (workload, "dispatcher_calls_by_route"))
            if calls:
                tasks = _lookup(variant.get("figures", {}), (workload, "tasks")) or 1
                text = ", ".join(
                    f"{route.split(' ')[-1]} {count:g} ({count / tasks:.3f}/task)"
                    for route, count in calls.items()
                )
                lines += [f"Worker calls to the dispatcher during {workload} (median): {text}", ""]
            lines += _cpu_lines(variant, workload, cores)
            lines += block_lines(variant, workload)
        prefill = variant.get("setup", {}).get("W4_prefill")
        if prefill:
            lines += [f"W4 prefill: {json.dumps(prefill)}", ""]
        for workload, error in (variant.get("errors") or {}).items():
            lines += [f"**{workload} failed**: {error}", ""]
    if "peers" in record:
        lines += render_peer_lines(record["peers"])
    return "\n".join(lines).rstrip() + "\n"


def block_lines(variant: Mapping[str, Any], workload: str) -> list[str]:
    """Postgres's shared-buffer blocks per task (`--postgres-blocks`), when measured."""
    blocks = _lookup(variant.get("figures", {}), (workload, "postgres_blocks_per_task"))
    if not blocks:
        return []
    busiest = ", ".join(
        f"{name} {counts['hit']:g}/{counts['read']:g}"
        for name, counts in blocks.get("by_relation", {}).items()
    )
    return [
        f"Postgres shared-buffer blocks per task during {workload} (median): {blocks['hit']:g} "
        f"hit, {blocks['read']:g} read from outside shared buffers; busiest (hit/read): {busiest}",
        "",
    ]


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_results(record: Mapping[str, Any], results_dir: Path) -> tuple[Path, Path]:
    results_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = results_dir / "latest.json", results_dir / "latest.md"
    _write(json_path, json.dumps(record, indent=2, default=str) + "\n")
    _write(md_path, render_markdown(record))
    return json_path, md_path
