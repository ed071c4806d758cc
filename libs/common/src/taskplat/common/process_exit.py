"""End a service process with its status once it has stopped, without the interpreter's teardown.

A stopped service has handed back what it held, flushed its spans and closed its connections; what
is left at exit is the interpreter's own teardown, whose full garbage collections over the heap of
boto3, pydantic and OpenTelemetry took 1 to 3 s of CPU on a busy 2-core machine after the
service logged that it had stopped (measured with a native stack of the exiting process:
`Py_FinalizeEx` -> `finalize_modules` -> `gc_collect_main`). An orchestrator waiting for the
exit (ECS, `make up`, the test stacks) waited that long for nothing.

Invariants: `exit_process` does everything a normal exit does that has an effect outside the
process, in the same order: it joins the non-daemon threads, runs the `atexit` handlers
(OpenTelemetry shutdown, logging flush, executor joins), flushes stdout and stderr; then it ends
the process with `status`, skipping only the freeing of the interpreter's objects. Only a `main`
that returned uses it: an exception still leaves through the interpreter (with its traceback).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_process(status: int) -> NoReturn:
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            # A closed or broken stream: the normal exit would have lost this output as well.
            pass
    os._exit(status)
