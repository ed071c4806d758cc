"""Entry point of ``python -m taskplat.chaos``; see ``taskplat.chaos.cli``.

Invariants: the process exit code is the one ``cli.main`` returns.
"""

from __future__ import annotations

from taskplat.chaos.cli import main

raise SystemExit(main())
