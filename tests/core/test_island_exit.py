"""A SIGTERM that reaches an island after its work is done (the head releasing it while
the interpreter shuts down) ends it with its own exit code and no traceback in its log."""

from __future__ import annotations

import signal
import subprocess
import sys

SCRIPT = """
import atexit, sys, time
from yeto_core.islands import main as island_main

island_main._install_sigterm()

def shutting_down():
    print("shutting down", flush=True)
    time.sleep(60)  # a thread being joined at exit

atexit.register(shutting_down)
island_main._exit_code.append(int(sys.argv[1]))
sys.exit(int(sys.argv[1]))
"""


def _run(code: int) -> tuple[int, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "shutting down"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def test_a_sigterm_at_shutdown_keeps_the_exit_code_and_prints_nothing():
    assert _run(0) == (0, "")
    assert _run(2) == (2, "")
