"""The ``local`` island provider: each island is an OS process group on this machine.

Every sampler island and every trainer incarnation runs as its own process
(``python -m <launch.entry_module>``, i.e. ``yeto_core.islands.main``) in a new
session, so it and everything it starts share one process group. Its
environment is this process's plus the launch record's ``env`` (store URL,
run id, role, island, incarnation, store credentials) and the launch's
submission time (``YETO_START_SUBMITTED_UNIX``); its working directory
is ``<state_dir>/work/<handle>`` (its scratch space; it reads nothing there
from the head). Output goes to ``<state_dir>/logs/<handle>.log``.

Handles are recorded in ``<run_dir>/islands/<handle>.json`` (pid, process
group, the leader's start time, the command) before ``launch`` returns, so a
head that was killed and restarted finds the islands it started
(:meth:`LocalIslands.orphans`) and releases them. A release sends SIGTERM to
the group, waits up to ``term_timeout_s``, then SIGKILL, and returns True
only once no process of the group is left.

A recorded process group id can outlive the island (a reboot, PID reuse), so
before any signal the provider checks that the group is still the island's:
each live member is either the recorded leader (same start time) or carries
the island's ``YETO_HANDLE`` in its environment. A group that is not the
island's is spared, never signalled; the handle counts as released and an
``orphan_spared`` event says which processes were spared and why.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

from yeto_core.errors import ConfigError, YetoError
from yeto_core.ports import IslandProvider
from yeto_core.providers.env import ENV_CPUS, parse_cpus, stamp_submitted
from yeto_core.providers.spare import Spare, kill_all, serves, spare_command
from yeto_core.records import Event, IslandLaunch, IslandStatus

ISLANDS_DIR = "islands"
LOGS_DIR = "logs"
WORK_DIR = "work"

#: Set for every island: its handle (for its log lines; islands do not need it).
ENV_HANDLE = "YETO_HANDLE"
#: the working directory of the process that launched the island (``yeto run up``): an
#: island runs in its own work dir, and resolves a user's relative paths against this
ENV_RUN_CWD = "YETO_RUN_CWD"


class IslandError(YetoError):
    """An island could not be launched or released."""


def default_command(entry_module: str = "yeto_core.islands.main") -> list[str]:
    """The island entry point with this interpreter."""
    return [sys.executable, "-m", entry_module]


def _proc_stat(pid: int) -> Optional[list[str]]:
    """Fields of ``/proc/<pid>/stat`` after the command name, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses.
    return raw[raw.rfind(")") + 2 :].split()


def _start_time(pid: int) -> Optional[str]:
    fields = _proc_stat(pid)
    return fields[19] if fields else None  # field 22 of stat: starttime


def _group_members(pgid: int) -> list[int]:
    """The live (non-zombie) processes of group ``pgid`` (Linux ``/proc``)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _proc_stat(int(entry.name))
            if fields and fields[0] != "Z" and fields[2] == str(pgid):
                members.append(int(entry.name))
    return members


def _environ_handle(pid: int) -> Optional[str]:
    """The ``YETO_HANDLE`` in ``pid``'s environment ("" if absent, None if unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = (ENV_HANDLE + "=").encode()
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return ""


def _group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in group ``pgid``."""
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            fields = _proc_stat(int(entry.name))
            if fields and fields[0] != "Z" and fields[2] == str(pgid):
                return True
        return False
    try:  # pragma: no cover - non-Linux
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LocalIslands(IslandProvider):
    """Islands as process groups on this machine.

    :param run_dir: where handles, logs and the islands' working directories are kept
        (the head's run dir).
    :param command: the argv of an island (default: ``python -m <launch.entry_module>``).
    :param launcher: ``subprocess.Popen``-compatible (injected for tests).
    :param clock: monotonic seconds (for release deadlines).
    :param term_timeout_s: how long a group gets after SIGTERM before SIGKILL.
    :param kill_timeout_s: how long to wait for the group to vanish after SIGKILL.
    :param on_event: called with each ``orphan_spared`` event.
    """

    PLUGIN_NAME = "local"

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        command: Optional[Sequence[str]] = None,
        launcher: Callable[..., Any] = subprocess.Popen,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        term_timeout_s: float = 10.0,
        kill_timeout_s: float = 10.0,
        on_event: Optional[Callable[[Event], None]] = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.on_event = on_event
        #: ``orphan_spared`` events of this provider (also passed to ``on_event``).
        self.spared: list[Event] = []
        self.command = list(command) if command is not None else None
        self.launcher = launcher
        self.clock = clock
        self.sleep = sleep
        self.term_timeout_s = term_timeout_s
        self.kill_timeout_s = kill_timeout_s
        self._procs: dict[str, Any] = {}
        self._log_offsets: dict[str, int] = {}
        #: warm spares by island, and the launch each island was prepared with
        #: (:mod:`yeto_core.providers.spare`); killed when this provider is collected
        self._spares: dict[str, Spare] = {}
        self._prepared: dict[str, IslandLaunch] = {}
        weakref.finalize(self, kill_all, self._spares)
        (self.run_dir / ISLANDS_DIR).mkdir(parents=True, exist_ok=True)
        (self.run_dir / LOGS_DIR).mkdir(parents=True, exist_ok=True)

    # -- records ---------------------------------------------------------------------

    def _record_path(self, handle: str) -> Path:
        return self.run_dir / ISLANDS_DIR / f"{handle}.json"

    def record(self, handle: str) -> Optional[dict[str, Any]]:
        """The launch record of ``handle`` (None if unknown or released)."""
        try:
            return json.loads(self._record_path(handle).read_text())
        except (OSError, ValueError):
            return None

    def handles(self) -> list[str]:
        """Every handle recorded in the run dir and not yet released."""
        return sorted(p.stem for p in (self.run_dir / ISLANDS_DIR).glob("*.json"))

    def log_path(self, handle: str) -> Path:
        return self.run_dir / LOGS_DIR / f"{handle}.log"

    # -- the port ----------------------------------------------------------------------

    def _env(self, launch: IslandLaunch) -> dict[str, str]:
        """The island's environment: this process's plus the launch's (no handle, no stamp)."""
        env = dict(os.environ)
        env.update(launch.env)
        env.setdefault(ENV_RUN_CWD, os.getcwd())
        cpus = launch.options.get("cpus")
        if cpus is not None:
            env[ENV_CPUS] = ",".join(str(c) for c in self._cpus(launch.handle, cpus))
        return env

    def prepare(self, launch: IslandLaunch) -> None:
        """Start a warm spare of ``launch``'s island (:mod:`yeto_core.providers.spare`), and
        another after each release of it, unless ``provider_options.spare = false`` or the
        provider runs a ``command`` of its own."""
        if self.command is not None or launch.options.get("spare", True) is False:
            return
        self._prepared[launch.island] = launch
        self._start_spare(launch)

    def _start_spare(self, launch: IslandLaunch) -> None:
        old = self._spares.pop(launch.island, None)
        if old is not None:
            old.kill()
        env = self._env(launch)
        work = self.run_dir / WORK_DIR
        work.mkdir(parents=True, exist_ok=True)
        log = self.run_dir / LOGS_DIR / f"{launch.island}.spare.log"
        try:
            proc = self._spawn(spare_command(launch.entry_module), work, env, log, subprocess.PIPE)
        except OSError:
            return  # no spare: the launch is cold
        self._spares[launch.island] = Spare(proc, env, launch.entry_module)

    def _take_spare(self, launch: IslandLaunch, env: dict[str, str]) -> Optional[Spare]:
        """The island's spare, when it lives and may serve this launch (else killed)."""
        spare = self._spares.pop(launch.island, None)
        if spare is None:
            return None
        if spare.alive() and spare.entry_module == launch.entry_module and serves(spare.env, env):
            return spare
        spare.kill()
        return None

    def launch(self, launch: IslandLaunch) -> str:
        """Start the island as a new process group (or hand its warm spare the launch);
        return its handle."""
        island, incarnation, handle = launch.island, launch.incarnation, launch.handle
        if self.record(handle) is not None:
            raise IslandError(
                f"island handle {handle!r} is already recorded in "
                f"{self._record_path(handle)}; release it before launching it again"
            )
        full_env = self._env(launch)
        full_env[ENV_HANDLE] = handle
        command = self.command or default_command(launch.entry_module)
        spare = self._take_spare(launch, full_env)  # only a prepared island has one
        full_env = stamp_submitted(full_env)  # last: the process starts right after
        cwd = self.run_dir / WORK_DIR / handle
        cwd.mkdir(parents=True, exist_ok=True)
        if spare is not None:
            try:
                proc = spare.become(full_env, str(cwd), str(self.log_path(handle)))
            except OSError:  # it died just now: launched cold below
                spare.kill()
                spare = None
        if spare is None:
            try:
                proc = self._spawn(
                    command, cwd, full_env, self.log_path(handle), subprocess.DEVNULL
                )
            except OSError as exc:
                raise IslandError(f"cannot launch island {handle!r} ({command!r}): {exc}") from exc
        self._procs[handle] = proc
        record = {
            "handle": handle,
            "island": island,
            "incarnation": incarnation,
            "pid": proc.pid,
            "pgid": proc.pid,  # start_new_session: the leader's pid is the group id
            "start_time": _start_time(proc.pid),
            "command": command,
            "launched_at": time.time(),
        }
        tmp = self._record_path(handle).with_suffix(".tmp")
        tmp.write_text(json.dumps(record, sort_keys=True))
        os.replace(tmp, self._record_path(handle))
        return handle

    def _spawn(
        self, command: list[str], cwd: Path, env: dict[str, str], log_path: Path, stdin: Any
    ) -> Any:
        """``command`` in a session of its own, its output appended to ``log_path``."""
        log = open(log_path, "ab")
        try:
            return self.launcher(
                command,
                cwd=str(cwd),
                env=env,
                stdin=stdin,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            log.close()

    @staticmethod
    def _cpus(handle: str, value: Any) -> list[int]:
        """``provider_options.cpus``, checked against the CPUs this process may use."""
        try:
            cpus = parse_cpus(value)
        except ConfigError as exc:
            raise IslandError(f"island {handle!r}: provider_options.{exc}") from exc
        allowed = os.sched_getaffinity(0)
        if not set(cpus) <= allowed:
            raise IslandError(
                f"island {handle!r}: provider_options.cpus = {value!r} names CPUs "
                f"{sorted(set(cpus) - allowed)} this machine does not offer (it has "
                f"{sorted(allowed)}); pick from those or drop the option"
            )
        return cpus

    def _reap(self, handle: str) -> Optional[int]:
        proc = self._procs.get(handle)
        if proc is None:
            return None
        return proc.poll()

    def _alive(self, handle: str, rec: dict[str, Any]) -> bool:
        self._reap(handle)
        return _group_alive(int(rec["pgid"]))

    def status(self, handle: str) -> IslandStatus:
        """``running`` (the leader lives), ``exited`` (leader gone, record kept) or ``gone``."""
        rec = self.record(handle)
        if rec is None:
            return IslandStatus.GONE
        code = self._reap(handle)
        pid = int(rec["pid"])
        if handle in self._procs:
            leader = code is None
        else:
            st = _proc_stat(pid)
            leader = st is not None and st[0] != "Z" and _start_time(pid) == rec["start_time"]
        if leader:
            return IslandStatus.RUNNING
        return IslandStatus.EXITED if not _group_alive(int(rec["pgid"])) else IslandStatus.RUNNING

    def returncode(self, handle: str) -> Optional[int]:
        """The leader's exit code, when this provider launched it and it exited."""
        return self._reap(handle)

    def log_hint(self, handle: str) -> str:
        return str(self.log_path(handle))

    def events(self, handle: str) -> Iterator[Event]:
        """New lines of the island's log since the last call, as ``log`` events."""
        path = self.log_path(handle)
        offset = self._log_offsets.get(handle, 0)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return iter(())
        end = data.rfind(b"\n") + 1
        self._log_offsets[handle] = offset + end
        now = time.time()
        return iter(
            Event(kind="log", time=now, source=handle, data={"line": line})
            for line in data[:end].decode(errors="replace").splitlines()
        )

    def _signal(self, pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass

    def _wait_gone(self, handle: str, rec: dict[str, Any], timeout_s: float) -> bool:
        deadline = self.clock() + timeout_s
        while True:
            if not self._alive(handle, rec):
                return True
            if self.clock() >= deadline:
                return False
            self.sleep(0.05)

    def strangers(self, handle: str, rec: dict[str, Any]) -> list[dict[str, Any]]:
        """Live members of the recorded group that are not ``handle``'s processes.

        Empty when the group is the island's (or gone). Only checkable where
        ``/proc`` exists; elsewhere the group is taken as recorded.
        """
        if handle in self._procs or not Path("/proc").is_dir():
            return []  # launched by this provider: the group is ours
        out = []
        for pid in _group_members(int(rec["pgid"])):
            if pid == int(rec["pid"]) and _start_time(pid) == rec.get("start_time"):
                continue
            marker = _environ_handle(pid)
            if marker == handle:
                continue
            out.append(
                {
                    "pid": pid,
                    "start_time": _start_time(pid),
                    "why": "unreadable environment"
                    if marker is None
                    else f"YETO_HANDLE is {marker!r}, not {handle!r}",
                }
            )
        return out

    def release(self, handle: str) -> bool:
        """SIGTERM the group, then SIGKILL after ``term_timeout_s``; True once it is gone.

        A group whose members are not all the island's (see :meth:`strangers`) is
        not signalled: the island is gone, its group id now names other processes.
        """
        rec = self.record(handle)
        if rec is None:
            return True
        pgid = int(rec["pgid"])
        strangers = self.strangers(handle, rec)
        if strangers:
            event = Event(
                kind="orphan_spared",
                time=time.time(),
                source=handle,
                data={
                    "handle": handle,
                    "pgid": pgid,
                    "recorded_pid": int(rec["pid"]),
                    "recorded_start_time": rec.get("start_time"),
                    "spared": strangers,
                    "why": "the recorded process group now holds processes that are not "
                    "this island's (PID reuse or a reboot); none was signalled",
                },
            )
            self.spared.append(event)
            if self.on_event is not None:
                self.on_event(event)
            self._record_path(handle).unlink(missing_ok=True)
            return True
        if self._alive(handle, rec):
            self._signal(pgid, signal.SIGTERM)
            if not self._wait_gone(handle, rec, self.term_timeout_s):
                self._signal(pgid, signal.SIGKILL)
                if not self._wait_gone(handle, rec, self.kill_timeout_s):
                    return False
        self._procs.pop(handle, None)
        self._record_path(handle).unlink(missing_ok=True)
        shutil.rmtree(self.run_dir / WORK_DIR / handle, ignore_errors=True)
        prepared = self._prepared.get(str(rec.get("island")))
        if prepared is not None and prepared.island not in self._spares:
            self._start_spare(prepared)  # for the island's next start
        return True

    def unprepare(self) -> None:
        """Kill the warm spares (islands launched are left to :meth:`release`)."""
        self._prepared.clear()
        kill_all(self._spares)

    def orphans(self) -> list[str]:
        """Recorded handles that this provider did not launch (a previous head's)."""
        return [h for h in self.handles() if h not in self._procs]
