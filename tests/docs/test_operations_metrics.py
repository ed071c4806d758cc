"""docs/operations.md lists every metric the code exports, and no metric the code does not export.

How the code's metrics are found: every instrument is created through `Telemetry` (its `counter`,
`histogram`, `up_down_counter` and `observable_gauge` methods, called directly or through a local
alias such as `counter = telemetry.counter`), so the test reads each such call in the packages'
sources (libs/*/src, services/*/src) with `ast`, then creates the same instrument (kind, name, unit)
in a fresh `Telemetry` and takes the name the real Prometheus exposition gives it (`_total` on
counters, `_seconds` on second-valued instruments, dots as underscores). A call whose metric name
is not a string literal (nor a name bound to one) fails the test, so nothing is skipped unseen.

The doc's names are the backticked `taskplat_*` names in the first column of the tables under
`## Metrics`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.metrics import CallbackOptions, Observation

from taskplat.common.telemetry import Telemetry

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
METHODS = {"counter": "1", "histogram": "s", "up_down_counter": "1", "observable_gauge": "1"}


@dataclass(frozen=True)
class Instrument:
    kind: str
    name: str
    unit: str
    where: str


def _source_files() -> list[Path]:
    files: list[Path] = []
    for pattern in ("libs/*/src", "services/*/src"):
        for src in sorted(ROOT.glob(pattern)):
            files += sorted(src.rglob("*.py"))
    return files


class _Finder(ast.NodeVisitor):
    """The `Telemetry` instrument calls of one module, with their literal names and units."""

    def __init__(self, path: Path, tree: ast.Module) -> None:
        self.path = path
        self.found: list[Instrument] = []
        self.unreadable: list[str] = []
        self.strings: dict[str, str] = {}
        self.aliases: dict[str, str] = {}
        self.params: list[set[str]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
                if not isinstance(target, ast.Name):
                    continue
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    self.strings[target.id] = value.value
                elif isinstance(value, ast.Attribute) and value.attr in METHODS:
                    self.aliases[target.id] = value.attr

    def _where(self, node: ast.AST) -> str:
        return f"{self.path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._visit_function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._visit_function(node)

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        args = node.args
        names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
        self.params.append(names)
        self.generic_visit(node)
        self.params.pop()

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in METHODS:
            kind = func.attr
        elif isinstance(func, ast.Name) and func.id in self.aliases:
            kind = self.aliases[func.id]
        else:
            return
        if not node.args:
            return
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            name = first.value
        elif isinstance(first, ast.Name) and first.id in self.strings:
            name = self.strings[first.id]
        elif isinstance(first, ast.Name) and self.params and first.id in self.params[-1]:
            return  # a helper forwarding its caller's name: the caller's call is read instead
        else:
            self.unreadable.append(self._where(node))
            return
        unit = METHODS[kind]
        for keyword in node.keywords:
            if keyword.arg == "unit" and isinstance(keyword.value, ast.Constant):
                unit = str(keyword.value.value)
        self.found.append(Instrument(kind, name, unit, self._where(node)))


def _instruments() -> tuple[list[Instrument], list[str]]:
    found: list[Instrument] = []
    unreadable: list[str] = []
    for path in _source_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        finder = _Finder(path, tree)
        finder.visit(tree)
        # A local helper named like a Telemetry method (`def counter(name, description)`) is
        # called with the literal names: read those calls as instruments of that kind.
        helpers = {
            n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in METHODS
        }
        finder.aliases.update({name: name for name in helpers})
        finder.found.clear()
        finder.unreadable.clear()
        finder.visit(tree)
        found += finder.found
        unreadable += finder.unreadable
    return found, unreadable


def _one(_options: CallbackOptions) -> list[Observation]:
    return [Observation(1)]


def _exported_name(instrument: Instrument) -> str:
    """The name the Prometheus exposition gives this instrument (created in a fresh Telemetry)."""
    telemetry = Telemetry("metrics-doc-probe")
    try:
        if instrument.kind == "counter":
            telemetry.counter(instrument.name, unit=instrument.unit).add(1)
        elif instrument.kind == "up_down_counter":
            telemetry.up_down_counter(instrument.name, unit=instrument.unit).add(1)
        elif instrument.kind == "histogram":
            telemetry.histogram(instrument.name, unit=instrument.unit).record(1.0)
        else:
            telemetry.observable_gauge(instrument.name, [_one], unit=instrument.unit)
        text = telemetry.prometheus_text().decode()
    finally:
        telemetry.shutdown()
    names = re.findall(r"^# TYPE (\S+) ", text, flags=re.MULTILINE)
    assert len(names) == 1, (instrument, text)
    return names[0]


def code_metrics() -> dict[str, str]:
    """Every exported metric name -> where in the code it is created."""
    found, unreadable = _instruments()
    assert not unreadable, (
        "instrument calls whose metric name is not a string literal (make it one, or bind it to "
        f"one in the module): {unreadable}"
    )
    exported: dict[str, str] = {}
    for instrument in found:
        exported.setdefault(_exported_name(instrument), instrument.where)
    return exported


def documented_metrics() -> set[str]:
    text = OPERATIONS.read_text(encoding="utf-8")
    start = text.index("\n## Metrics")
    end = text.index("\n## ", start + 1)
    names: set[str] = set()
    for line in text[start:end].splitlines():
        if not line.startswith("| `"):
            continue
        first_cell = line.split("|")[1]
        names.update(re.findall(r"`(taskplat_\w+)`", first_cell))
    return names


def test_the_finder_sees_the_instruments_it_must() -> None:
    exported = code_metrics()
    for name in (
        "taskplat_tasks_created_total",  # Recorder: `counter = telemetry.counter` alias
        "taskplat_tasks_current",  # StateGauges: `gauge = telemetry.observable_gauge` alias
        "taskplat_sqs_received_total",  # worker wrapper: a local `counter(name, ...)` helper
        "taskplat_operator_run_time_seconds",  # worker wrapper: name bound to a local string
        "taskplat_loop_batch_size",  # a histogram with unit "1"
        "taskplat_http_server_duration_seconds",
    ):
        assert name in exported, name


def test_operations_md_lists_every_exported_metric() -> None:
    exported = code_metrics()
    documented = documented_metrics()
    missing = sorted(set(exported) - documented)
    extra = sorted(documented - set(exported))
    problems = []
    if missing:
        problems.append(
            "exported but missing from docs/operations.md's Metrics tables: "
            + ", ".join(f"{name} ({exported[name]})" for name in missing)
        )
    if extra:
        problems.append("listed in docs/operations.md but exported by no code: " + ", ".join(extra))
    assert not problems, "\n".join(problems)
