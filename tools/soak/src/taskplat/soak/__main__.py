"""Entry point of ``python -m taskplat.soak``; see ``taskplat.soak.cli``.

Invariants: the process exit code is the one ``cli.main`` returns.
"""

from __future__ import annotations

from taskplat.soak.cli import main

raise SystemExit(main())
