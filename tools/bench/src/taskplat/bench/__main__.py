"""Entry point of ``python -m taskplat.bench``; see ``taskplat.bench.cli``.

Invariants: the process exit code is the one ``cli.main`` returns.
"""

from __future__ import annotations

from taskplat.bench.cli import main

raise SystemExit(main())
