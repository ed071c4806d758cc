"""What the image tests share: the image tag under test and what the session prints at its end.

Invariant: a module name unique in the repository (tests/images is on pytest's pythonpath).
"""

from __future__ import annotations

import os

TAG = os.environ.get("IMAGE_TAG", "dev")
EXAMPLE_QUEUE = "example"  # the task queue of the example worker image's pool
REPORT: dict[str, list[str]] = {"sizes": [], "healthy": []}
