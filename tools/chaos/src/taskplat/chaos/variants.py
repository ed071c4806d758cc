"""`make chaos`: the variants one after the other (default: both, waiting claims first), each a
`ChaosRun` with a fresh stack in `<run_dir>/<variant>`; the run fails when either fails.

Invariants: the seed is drawn once and printed, each variant's is derived from it
(`variant_configs`); each report and the comparison are printed, and written as JSON to
`<run_dir>/<variant>/chaos-summary.json` and `<run_dir>/chaos-summary.json`.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import replace

from taskplat.chaos.config import VARIANTS, ChaosConfig, variant_configs
from taskplat.chaos.report import comparison, config_json, report
from taskplat.chaos.run import ChaosRun, Say
from taskplat.chaos.verdict import ChaosResult


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
                {"config": config_json(each), "result": result.to_json(), "text": text}, indent=2
            )
        )
        runs.append((each, result, text))
    table = comparison([result for _, result, _ in runs])
    ok = all(result.verdict.ok for _, result, _ in runs)
    print(table + "\nresult: " + ("PASS" if ok else "FAIL"), flush=True)
    (config.run_dir / "chaos-summary.json").write_text(
        json.dumps(
            {
                "config": config_json(config),
                "variants": {
                    result.variant: {
                        "config": config_json(each),
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
