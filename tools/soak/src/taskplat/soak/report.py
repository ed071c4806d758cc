"""The soak's report: `soak.json` (configuration, totals, every series' samples and judgement),
`soak.md` (a table of the judgements, failures first, with a link to each plot) and one PNG per
series in `plots/` (the samples, the second half's fitted line, the verdict in the title).

Invariants: matplotlib draws off-screen (the Agg backend, no display needed); a plot's file name
is the series' name reduced to `[a-z0-9_-]`, unique within a report.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after use(): the backend is chosen first

from taskplat.soak.series import UNITS, Judgement, Series, fit_slope


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-") or "series"


def _human(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "bytes":
        for suffix, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if abs(value) >= size:
                return f"{value / size:.1f} {suffix}"
        return f"{value:.0f} B"
    return f"{value:.1f}" if abs(value) < 100 else f"{value:.0f}"


def plot(series: Series, judgement: Judgement, half: float, path: Path, figure: Any) -> None:
    """Draw one series on `figure` (cleared first; one figure serves every plot: creating and
    laying out a figure costs more than drawing on it)."""
    unit = UNITS[series.kind]
    scale = 1 << 20 if unit == "bytes" else 1
    label = "MiB" if unit == "bytes" else unit
    figure.clear()
    axes = figure.add_axes((0.1, 0.17, 0.87, 0.72))
    ts = [t / 60 for t, _ in series.points]
    axes.plot(ts, [v / scale for _, v in series.points], marker=".", linewidth=1)
    second = [(t, v) for t, v in series.points if t >= half]
    if len(second) >= 2:
        slope = fit_slope(second)
        t0 = sum(t for t, _ in second) / len(second)
        v0 = sum(v for _, v in second) / len(second)
        ends = (second[0][0], second[-1][0])
        axes.plot(
            [t / 60 for t in ends],
            [(v0 + slope * (t - t0)) / scale for t in ends],
            color="red",
            linewidth=1.5,
            label="second-half fit",
        )
        axes.legend(loc="upper left", fontsize=7)
    axes.axvline(half / 60, color="grey", linestyle=":", linewidth=1)
    verdict = "OK" if judgement.ok else "GROWS"
    axes.set_title(f"{series.name}: {verdict} ({judgement.reason})", fontsize=8)
    axes.set_xlabel("minutes since the load started", fontsize=8)
    axes.set_ylabel(label, fontsize=8)
    axes.tick_params(labelsize=7)
    axes.set_ylim(bottom=0)
    figure.savefig(path)


def write(
    report_dir: Path,
    *,
    config: dict[str, Any],
    totals: dict[str, Any],
    series: list[Series],
    judgements: list[Judgement],
    half: float,
    problems: list[str],
) -> str:
    """Write the report; return the markdown text."""
    plots = report_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    by_name = {s.name: s for s in series}
    files: dict[str, str] = {}
    figure = plt.figure(figsize=(7, 3), dpi=80)
    try:
        for judgement in judgements:
            name = f"{slug(judgement.name)}.png"
            plot(by_name[judgement.name], judgement, half, plots / name, figure)
            files[judgement.name] = f"plots/{name}"
    finally:
        plt.close(figure)
    ok = not problems and all(j.ok for j in judgements)
    ordered = sorted(judgements, key=lambda j: (j.ok, not j.judged, j.kind, j.name))
    lines = [
        "# Soak report",
        "",
        f"result: **{'PASS' if ok else 'FAIL'}**",
        "",
        "| setting | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in config.items()),
        "",
        "| total | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in totals.items()),
        "",
    ]
    if problems:
        lines += ["## Problems", "", *(f"- {p}" for p in problems), ""]
    lines += [
        "## Series",
        "",
        "Rule: over the second half, a least-squares line; its projected growth over that "
        "half must not exceed max(relative x mean level, floor) of the series' kind "
        '(docs/operations.md, "Soak").',
        "",
        "| series | verdict | mean (2nd half) | slope / min | projected growth | allowance "
        "| plot |",
        "|---|---|---|---|---|---|---|",
    ]
    for j in ordered:
        unit = UNITS[j.kind]
        verdict = "OK" if j.ok and j.judged else ("info" if j.ok else "**GROWS**")
        lines.append(
            f"| {j.name} | {verdict} | {_human(j.level, unit)} | "
            f"{_human(j.slope_per_minute, unit)} | {_human(j.projected_growth, unit)} | "
            f"{_human(j.allowance, unit)} | [png]({files[j.name]}) |"
        )
    text = "\n".join(lines) + "\n"
    (report_dir / "soak.md").write_text(text)
    document = {
        "ok": ok,
        "config": config,
        "totals": totals,
        "problems": problems,
        "judgements": [asdict(j) for j in judgements],
        "series": {
            s.name: {"kind": s.kind, "judged": s.judged, "points": s.points} for s in series
        },
        "plots": files,
    }
    (report_dir / "soak.json").write_text(json.dumps(document, indent=2))
    return text
