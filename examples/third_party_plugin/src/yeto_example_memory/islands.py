"""The ``tempdir`` island provider: each island a process group in a fresh, empty directory.

Written only against ``yeto_core.ports.IslandProvider`` and the
``IslandLaunch`` record, as any cloud or marketplace provider would be: the
island process gets **only** the launch record's environment (the store URL,
the run id, its role, island and incarnation, the store's explicit
credentials) plus ``PATH``, and starts in a new empty directory, so it can
use nothing of the head's machine but the interpreter. Handles and logs live
under ``<state_dir>/tempdir/``; a restarted head finds the islands a previous
one left (``orphans``) from those files.

``provider_options`` (per ``[[samplers]]`` table or ``[trainer]``):

- ``root`` (path, default: the system's temporary directory): where island directories go.
- ``keep_dirs`` (bool, default false): keep an island's directory after its release.
- ``term_timeout_s`` (float, default 10): SIGTERM grace before SIGKILL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from yeto_core.ports import IslandProvider
from yeto_core.records import Event, IslandStatus


class TempDirIslands(IslandProvider):
    PLUGIN_NAME = "tempdir"

    def __init__(self, state_dir):
        self.dir = Path(state_dir) / self.PLUGIN_NAME
        self.dir.mkdir(parents=True, exist_ok=True)
        self.procs = {}
        self._log_offsets = {}

    # -- records -------------------------------------------------------------------

    def _record(self, handle):
        try:
            return json.loads((self.dir / f"{handle}.json").read_text())
        except (OSError, ValueError):
            return None

    def log_hint(self, handle):
        return str(self.dir / f"{handle}.log")

    # -- the port --------------------------------------------------------------------

    def launch(self, launch):
        handle = launch.handle
        if self._record(handle) is not None:
            raise RuntimeError(f"tempdir island {handle} is still recorded; release it first")
        root = launch.options.get("root")
        if root:
            Path(root).mkdir(parents=True, exist_ok=True)
        cwd = tempfile.mkdtemp(prefix=f"yeto-{handle}-", dir=root or None)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **launch.env}
        with open(self.log_hint(handle), "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", launch.entry_module],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        self.procs[handle] = proc
        record = {
            "pgid": proc.pid,
            "cwd": cwd,
            "options": dict(launch.options),
            "launched_at": time.time(),
        }
        tmp = self.dir / f".{handle}.json.tmp"
        tmp.write_text(json.dumps(record, sort_keys=True))
        os.replace(tmp, self.dir / f"{handle}.json")
        return handle

    def _gone(self, handle, pgid):
        proc = self.procs.get(handle)
        if proc is not None:
            proc.poll()  # reap the leader so that it does not linger as a zombie
        else:
            try:  # a leader launched by an earlier provider object of this process
                os.waitpid(pgid, os.WNOHANG)
            except ChildProcessError:
                pass
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    def status(self, handle):
        rec = self._record(handle)
        if rec is None:
            return IslandStatus.GONE
        proc = self.procs.get(handle)
        if proc is not None and proc.poll() is None:
            return IslandStatus.RUNNING
        return IslandStatus.EXITED if self._gone(handle, rec["pgid"]) else IslandStatus.RUNNING

    def returncode(self, handle):
        proc = self.procs.get(handle)
        return None if proc is None else proc.poll()

    def events(self, handle):
        path = Path(self.log_hint(handle))
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

    def release(self, handle):
        rec = self._record(handle)
        if rec is None:
            return True
        pgid = rec["pgid"]
        grace = float(rec["options"].get("term_timeout_s", 10.0))
        for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            if self._gone(handle, pgid):
                break
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while not self._gone(handle, pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
        if not self._gone(handle, pgid):
            return False
        self.procs.pop(handle, None)
        if not rec["options"].get("keep_dirs", False):
            shutil.rmtree(rec["cwd"], ignore_errors=True)
        (self.dir / f"{handle}.json").unlink(missing_ok=True)
        return True

    def orphans(self):
        return sorted(p.stem for p in self.dir.glob("*.json") if p.stem not in self.procs)
