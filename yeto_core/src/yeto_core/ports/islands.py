"""The island provider port (see :mod:`yeto_core.ports`)."""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Optional

from yeto_core.ports.base import Port
from yeto_core.records import (
    Event,
    IslandLaunch,
    IslandStatus,
)


class IslandProvider(Port):
    """Runs islands (a process group, a cloud function, a cluster, a leased machine).

    ``provider`` in each ``[[samplers]]`` table and in ``[trainer]`` chooses it
    (built-in: ``local``); ``provider_options`` of that table reach
    :meth:`launch` as ``launch.options``. The head builds one provider per name
    with :meth:`create`, giving it ``state_dir``, a directory on the head's
    machine the provider may use for handles and logs (keep your files under
    ``state_dir / PLUGIN_NAME``).

    An island needs only the store: :meth:`launch` receives an
    :class:`~yeto_core.records.IslandLaunch` whose ``env`` is the island's whole
    environment (store URL, run id, role, island, incarnation, explicit store
    credentials). Start ``python -m <launch.entry_module>`` with it wherever the
    island runs, or call ``yeto_core.islands.main.run_island(launch.env)`` in
    process. Return a handle (``launch.handle`` is a good one) that
    :meth:`status` and :meth:`release` understand, also in a restarted head
    (:meth:`orphans`).

    Complete plugin (each island a process group in a fresh empty directory)::

        import json
        import os
        import signal
        import subprocess
        import sys
        import tempfile
        import time
        from pathlib import Path

        from yeto_core import hookimpl
        from yeto_core.ports import IslandProvider
        from yeto_core.records import IslandStatus

        class TempDirIslands(IslandProvider):
            PLUGIN_NAME = "tempdir"

            def __init__(self, state_dir):
                self.dir = Path(state_dir) / self.PLUGIN_NAME
                self.dir.mkdir(parents=True, exist_ok=True)
                self.procs = {}

            def launch(self, launch):
                cwd = tempfile.mkdtemp(prefix=f"yeto-{launch.handle}-")
                env = {"PATH": os.environ.get("PATH", ""), **launch.env}
                with open(self.dir / f"{launch.handle}.log", "ab") as log:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", launch.entry_module], cwd=cwd, env=env,
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                        start_new_session=True)
                self.procs[launch.handle] = proc
                (self.dir / f"{launch.handle}.json").write_text(json.dumps({"pgid": proc.pid}))
                return launch.handle

            def _pgid(self, handle):
                try:
                    return json.loads((self.dir / f"{handle}.json").read_text())["pgid"]
                except OSError:
                    return None

            def _gone(self, handle, pgid):
                if handle in self.procs:
                    self.procs[handle].poll()  # reap our leader (keeps its exit code)
                else:
                    try:  # a leader an earlier provider object of this process launched
                        os.waitpid(pgid, os.WNOHANG)
                    except ChildProcessError:
                        pass
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    return True
                return False

            def status(self, handle):
                pgid = self._pgid(handle)
                if pgid is None:
                    return IslandStatus.GONE
                return IslandStatus.EXITED if self._gone(handle, pgid) else IslandStatus.RUNNING

            def events(self, handle):
                return iter(())

            def release(self, handle):
                pgid = self._pgid(handle)
                if pgid is None:
                    return True
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    if self._gone(handle, pgid):
                        break
                    try:
                        os.killpg(pgid, sig)
                    except ProcessLookupError:
                        break
                    deadline = time.monotonic() + 10.0
                    while not self._gone(handle, pgid) and time.monotonic() < deadline:
                        time.sleep(0.05)
                if not self._gone(handle, pgid):
                    return False
                self.procs.pop(handle, None)
                (self.dir / f"{handle}.json").unlink(missing_ok=True)
                return True

            def orphans(self):
                return [p.stem for p in self.dir.glob("*.json") if p.stem not in self.procs]

            def returncode(self, handle):
                proc = self.procs.get(handle)
                return None if proc is None else proc.poll()

            def log_hint(self, handle):
                return str(self.dir / f"{handle}.log")

        @hookimpl
        def yeto_register_island_providers(register):
            register(TempDirIslands)
    """

    PORT = "IslandProvider"

    @classmethod
    def create(cls, state_dir: Path) -> IslandProvider:
        """Build the provider of a head whose local files live in ``state_dir``.

        Default: ``cls(state_dir)``.
        """
        return cls(state_dir)  # type: ignore[call-arg]

    @abc.abstractmethod
    def launch(self, launch: IslandLaunch) -> str:
        """Start the island ``launch`` describes; return its handle (kept by the head)."""

    @abc.abstractmethod
    def status(self, handle: str) -> IslandStatus:
        """Where the island is (:class:`~yeto_core.records.IslandStatus`; never blocks long)."""

    @abc.abstractmethod
    def events(self, handle: str) -> Iterator[Event]:
        """Provider-side events since the last call (log lines, preemption notices)."""

    @abc.abstractmethod
    def release(self, handle: str) -> bool:
        """Stop the island and verify it is gone; return True once verified."""

    @abc.abstractmethod
    def orphans(self) -> list[str]:
        """Handles of islands still held that this provider object did not launch."""

    # -- optional capabilities ---------------------------------------------------------

    def returncode(self, handle: str) -> Optional[int]:
        """The island's exit code once it exited (None: unknown)."""
        return None

    def log_hint(self, handle: str) -> str:
        """Where a user finds the island's output (a path, a console URL); default: ``""``."""
        return ""

    def prepare(self, launch: IslandLaunch) -> None:
        """The head will launch ``launch``'s island soon, and again after each release (a
        trainer that S1 stops and starts): get ready to launch it faster (the ``local``
        provider keeps a warm spare process, :mod:`yeto_core.providers.spare`). Default:
        nothing."""

    def unprepare(self) -> None:
        """The head launches nothing more: drop what :meth:`prepare` keeps. Default: nothing."""

    def replace_soon(self, handle: str) -> bool:
        """Whether the island will be lost soon (an eviction notice, a lease that cannot be
        renewed): the head then launches its replacement now, so capacity does not drop,
        and hands over when the island is lost. Default: False."""
        return False

    def billed(self) -> dict[str, dict[str, Any]]:
        """What the platform itself billed, per handle (``yeto cost`` shows it).

        ``{handle: {"island": str, "usd": float, "seconds": float}}`` from the platform's
        own records (a marketplace's per-second billing), for the handles this provider's
        ``state_dir`` knows, beside the cost ledger's estimate (held time x the configured
        ``price_per_hour``). Default: ``{}`` (nothing the provider can read back).
        """
        return {}

    def pool_bounds(self, options: Mapping[str, Any]) -> Optional[tuple[int, int]]:
        """``(min, max)`` islands of a sampler group whose islands join and leave by the
        backlog and the budget (the head's pool rule, ``docs/nc.md``), given the group's
        ``provider_options``. Default: None (the group's ``count`` islands, always)."""
        return None

    def price_per_hour(self, handle: str) -> Optional[float]:
        """Dollars per hour ``handle`` is billed at now, as the provider knows it.

        The head asks at each launch and again every few seconds while the island
        runs (a spot price can change); a change is a record of the resource ledger
        (:mod:`yeto_core.cost.ledger`). None (the default): the provider knows no price, and
        the config's ``price_per_hour`` of the island's table is used. With
        ``[cost] prices = "config"`` the config's price is used always.
        """
        return None
