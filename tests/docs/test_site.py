"""The documentation site builds with `mkdocs build --strict`, as `make docs` does.

Strict, with mkdocs.yml's `validation` settings, fails the build on a broken link or anchor or a
page of docs/ left out of the navigation; the generated reference pages (tools/docs_site/hooks.py)
are built from the code in the same run, so an error in them fails it too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _build(site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_site_builds_strictly_with_every_reference_page(tmp_path: Path) -> None:
    result = _build(tmp_path / "site")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "WARNING" not in result.stderr, result.stderr[-4000:]
    from taskplat.dispatcher.route_table import ALL_ROUTES

    api = (tmp_path / "site" / "reference" / "http-api" / "index.html").read_text(encoding="utf-8")
    missing = [f"{s.method} {s.path}" for s in ALL_ROUTES if f"{s.method} {s.path}" not in api]
    assert not missing, f"the HTTP API page lacks these routes: {missing}"
    from taskplat.common.metric_spec import declared_metrics

    metrics = (tmp_path / "site" / "reference" / "metrics" / "index.html").read_text("utf-8")
    exposed = [metric.exposed_name for _, each in declared_metrics() for metric in each]
    assert [name for name in exposed if f"<code>{name}</code>" not in metrics] == []
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "taskplat submit" in cli
    assert (tmp_path / "site" / "reference" / "openapi.json").is_file()
    # Mermaid ships with the site, so the diagrams render without a CDN.
    architecture = (tmp_path / "site" / "ARCHITECTURE" / "index.html").read_text(encoding="utf-8")
    assert 'class="mermaid"' in architecture
    script = re.search(r'src="\.\./(assets/javascripts/mermaid-[0-9.]+\.min\.js)"', architecture)
    assert script and (tmp_path / "site" / script.group(1)).is_file()
