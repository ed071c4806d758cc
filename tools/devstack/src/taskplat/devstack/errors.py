"""The one exception type of the devstack.

Invariants:
- Every expected failure (a missing binary, a server that does not come up, a failed install)
  is raised as ``DevstackError`` with a message a person can act on, including the tail of the
  relevant log when there is one. Anything else escaping the package is a bug.
"""

from __future__ import annotations


class DevstackError(RuntimeError):
    """An expected failure of the local stack, with a human-readable message."""
