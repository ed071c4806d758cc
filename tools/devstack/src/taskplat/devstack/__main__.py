"""Entry point of ``python -m taskplat.devstack``; see ``taskplat.devstack.cli``.

Invariants: the process exit code is the one ``cli.main`` returns.
"""

from __future__ import annotations

from taskplat.devstack.cli import main

raise SystemExit(main())
