"""`exit_process`: a normal exit's effects (threads joined, atexit handlers, flushed output, the
status) without the interpreter's teardown, whose collections made stopped services linger."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import atexit, sys, threading, time
    from pathlib import Path
    from taskplat.common.process_exit import exit_process

    out = Path(sys.argv[1])

    def note(line):
        with out.open("a") as f:
            f.write(line + "\\n")

    class Torn:
        def __del__(self):
            note("torn down")

    held = Torn()
    atexit.register(note, "atexit ran")

    def late():
        time.sleep(0.3)
        note("thread finished")

    threading.Thread(target=late).start()
    print("unflushed output", end="")
    exit_process(int(sys.argv[2]))
    """
)


def test_it_joins_threads_runs_atexit_flushes_and_skips_the_teardown(tmp_path: Path) -> None:
    out = tmp_path / "notes"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(out), "3"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "unflushed output"
    # The non-daemon thread ended before the atexit handlers ran; the module's objects were
    # never torn down (a normal exit would have run `Torn.__del__`).
    assert out.read_text().splitlines() == ["thread finished", "atexit ran"]
