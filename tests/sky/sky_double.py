"""A test double of the SkyPilot seam: each "cluster" runs its task's run command locally.

Nothing here talks to SkyPilot or a cloud.

The task's ``run`` runs as a process group in a fresh empty directory with the
task's ``envs`` and ``secrets`` (plus ``PATH`` with this interpreter first), so
an island gets nothing but what the task carries. The double can preempt a
spot cluster, fail the next launch (optionally leaving the cluster up, as a
failed SkyPilot setup does), and hold a cluster nobody recorded (an orphan).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Optional

from yeto_sky.seam import SkyLaunchError, SkySeam


class LocalCloud(SkySeam):
    def __init__(self, root: Path, *, launch_delay_s: float = 0.0) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.launch_delay_s = launch_delay_s
        self.lock = threading.Lock()
        self.clusters_: dict[str, dict[str, Any]] = {}
        self.requests: dict[str, tuple[str, Mapping[str, Any], int]] = {}
        self.ids = itertools.count(1)
        self.fail_next: Optional[tuple[str, bool]] = None
        self.calls: list[tuple[str, Any]] = []
        self.downs: list[str] = []

    # -- knobs -------------------------------------------------------------------------

    def fail_next_launch(self, message: str, *, leave_cluster: bool = False) -> None:
        self.fail_next = (message, leave_cluster)

    def preempt(self, cluster: str) -> None:
        """The cloud takes the spot cluster back: its processes die and it vanishes."""
        with self.lock:
            c = self.clusters_.pop(cluster)
        if not c["spot"]:
            raise AssertionError(f"{cluster} is not a spot cluster")
        self._kill(c)

    def leave_orphan(self, cluster: str) -> None:
        """A cluster of the run that no journal holds (its process sleeps)."""
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True
        )
        with self.lock:
            self.clusters_[cluster] = {"status": "UP", "proc": proc, "spot": False, "log": None}

    def processes(self) -> dict[str, Any]:
        return {name: c["proc"] for name, c in self.clusters_.items() if c.get("proc")}

    # -- the seam ----------------------------------------------------------------------

    def launch(self, task_config: Mapping[str, Any], cluster: str, autostop_minutes: int) -> str:
        rid = f"req-{next(self.ids)}"
        self.calls.append(("launch", cluster))
        with self.lock:
            self.requests[rid] = (cluster, dict(task_config), autostop_minutes)
            self.clusters_.setdefault(cluster, {"status": "INIT", "proc": None, "spot": False})
        return rid

    def wait_launch(self, request_id: str) -> Optional[int]:
        cluster, config, _ = self.requests[request_id]
        if self.launch_delay_s:
            time.sleep(self.launch_delay_s)
        if self.fail_next is not None:
            message, leave = self.fail_next
            self.fail_next = None
            with self.lock:
                if leave:
                    self.clusters_[cluster]["status"] = "INIT"
                else:
                    self.clusters_.pop(cluster, None)
            raise SkyLaunchError(message)
        work = Path(tempfile.mkdtemp(prefix=f"{cluster}-", dir=self.root))
        env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.update(config.get("envs", {}))
        env.update(config.get("secrets", {}))
        for k in ("HOME", "TMPDIR", "PYTHONPATH"):  # the test machine's, not the head's data
            if k in os.environ:
                env.setdefault(k, os.environ[k])
        log = work.parent / f"{cluster}.log"
        with open(log, "ab") as f:
            proc = subprocess.Popen(
                ["bash", "-c", config["run"]],
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        spot = bool(config.get("resources", {}).get("use_spot"))
        with self.lock:
            self.clusters_[cluster] = {
                "status": "UP",
                "proc": proc,
                "spot": spot,
                "log": log,
                "cwd": work,
                "env": env,
            }
        return 1

    def clusters(self, names: Optional[list[str]] = None) -> dict[str, str]:
        with self.lock:
            return {
                n: c["status"] for n, c in self.clusters_.items() if names is None or n in names
            }

    def job_status(self, cluster: str, job_id: int) -> Optional[str]:
        c = self.clusters_.get(cluster)
        if c is None or c.get("proc") is None:
            return None
        code = c["proc"].poll()
        if code is None:
            return "RUNNING"
        return "SUCCEEDED" if code == 0 else "FAILED"

    def down(self, cluster: str) -> None:
        self.downs.append(cluster)
        with self.lock:
            c = self.clusters_.pop(cluster, None)
        if c is not None:
            self._kill(c, signal.SIGTERM)

    def logs(self, cluster: str, job_id: int) -> Iterator[str]:
        c = self.clusters_.get(cluster)
        if c is None or c.get("log") is None:
            return
        with open(c["log"], encoding="utf-8", errors="replace") as f:
            pending = ""
            while True:
                chunk = f.read()
                if chunk:
                    pending += chunk
                    *lines, pending = pending.split("\n")
                    yield from lines
                    continue
                if c["proc"].poll() is not None:
                    break
                time.sleep(0.05)
            if pending:
                yield pending

    # -- helpers -----------------------------------------------------------------------

    def _kill(self, c: dict[str, Any], sig: int = signal.SIGKILL) -> None:
        """A preemption kills at once; a teardown stops the machine (SIGTERM, then SIGKILL)."""
        proc = c.get("proc")
        if proc is None:
            return
        for s in (sig, signal.SIGKILL):
            try:
                os.killpg(proc.pid, s)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # the rest of the group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def shutdown(self) -> None:
        for name in list(self.clusters_):
            self.down(name)
