"""Warm spares of the ``local`` provider: an island's process started before its launch.

A trainer under S1 starts and stops again and again, and on one machine most of a start
is the island's Python imports (torch, transformers: seconds), not its work. When the head
says it will launch an island (:meth:`~yeto_core.ports.IslandProvider.prepare`: the
trainer island, at the run's start), the local provider starts a **spare**: ``python -m
yeto_core.islands.spare <entry module>`` in a session of its own, as an island is, which
imports the island's entry module and what the island will use
(:func:`yeto_core.islands.main.preload`: the run's trainer backend, and the libraries it
names), then waits on its standard input. A launch of that island hands the spare its
environment, working directory and log as one JSON line, and the spare becomes the island:
the same process group, pid and signals as a cold launch, its start stamped at the
hand-over, so ``T_s`` is what the start cost. After the island is released the provider
starts the next spare, for the next start.

A spare is used only when the launch's environment equals the one it was started with but
for the launch's own variables (:data:`PER_LAUNCH`: incarnation, cut, handle, submission
time, CPUs), so whatever the interpreter or a library read at import time is what a cold
launch would have read; otherwise it is killed and the island launched cold. A spare whose
provider went away reads the end of its input and exits; the provider kills the spares it
holds when it is closed or collected.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import attrs

from yeto_core.providers.env import ENV_CPUS, ENV_CUT, ENV_INCARNATION, ENV_START_SUBMITTED

#: variables a launch sets for itself: a spare started without them (or with other values)
#: serves the launch; any other difference means a cold launch
PER_LAUNCH = frozenset(
    {ENV_INCARNATION, ENV_CUT, ENV_START_SUBMITTED, ENV_CPUS, "YETO_HANDLE", "YETO_RUN_CWD"}
)


#: the spare process's entry point (:mod:`yeto_core.islands.spare`)
SPARE_MODULE = "yeto_core.islands.spare"


def spare_command(entry_module: str) -> list[str]:
    """The argv of a spare for an island run as ``python -m <entry_module>``."""
    return [sys.executable, "-m", SPARE_MODULE, entry_module]


def serves(started_with: Mapping[str, str], launch_env: Mapping[str, str]) -> bool:
    """Whether a spare started with ``started_with`` may become an island of ``launch_env``."""
    keys = set(started_with) | set(launch_env)
    return all(started_with.get(k) == launch_env.get(k) for k in keys if k not in PER_LAUNCH)


@attrs.define
class Spare:
    """A spare process the provider holds for one island."""

    proc: Any  # subprocess.Popen, its stdin a pipe
    env: dict[str, str]
    entry_module: str

    def alive(self) -> bool:
        return self.proc.poll() is None

    def become(self, env: Mapping[str, str], cwd: str, log: str) -> Any:
        """Hand the spare its launch; :returns: its process, now the island's."""
        line = json.dumps({"env": dict(env), "cwd": cwd, "log": log}) + "\n"
        self.proc.stdin.write(line.encode())
        self.proc.stdin.close()
        return self.proc

    def kill(self) -> None:
        """SIGKILL its group (it is in a session of its own) and reap it."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def kill_all(spares: dict[str, Spare]) -> None:
    """Kill every spare of ``spares`` (a provider's, when it is closed or collected)."""
    for spare in list(spares.values()):
        spare.kill()
    spares.clear()
