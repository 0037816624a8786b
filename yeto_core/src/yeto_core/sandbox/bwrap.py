"""The ``bwrap`` sandbox host: each sandbox a bubblewrap namespace on this machine.

A sandbox is a ``bwrap`` process holding new mount, PID, network, IPC and UTS
namespaces: the host's root bound read-only, a private tmpfs over ``/tmp`` (the
work dir, ``work_mb`` MiB), a private ``/dev`` and ``/proc``, no network interface but
loopback, and ``sleep`` as its PID 1. Each command enters those namespaces with
``nsenter`` as an unprivileged user (``uid``/``gid``, default ``nobody``) with
``no_new_privs``, under ``prlimit`` (RLIMIT_CPU: its CPU seconds, then SIGXCPU;
RLIMIT_AS: its memory), and is killed at its wall-clock limit; after every command
every process it left in the namespace is killed (a ``/proc`` scan of the PID
namespace: a tool that forks, ``setsid``s or daemonizes is found all the same).
Removing a sandbox kills its PID 1, which ends every process of the namespace.

Labels live in ``<state_dir>/bwrap/<id>.json`` (with the pids and the namespace of
the sandbox and the pid of the process that started it), so a restarted island on
this machine lists and sweeps what its predecessor left. docs/agentic.md.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from yeto_core.ports.sandbox import (
    SandboxFailure,
    SandboxHost,
    SandboxInfo,
    SandboxLimits,
    SandboxResult,
)
from yeto_core.sandbox import procs

#: the work dir in a sandbox: a private tmpfs over the host's /tmp (a mount point needs a
#: directory the read-only root has; /tmp is on every machine and tools expect it writable)
WORK_DIR = "/tmp"
#: the environment of every command (nothing of the island's: no store credentials)
COMMAND_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORK_DIR,
    "TMPDIR": WORK_DIR,
    "LANG": "C.UTF-8",
}
INSTALL_HINT = "install Debian's bubblewrap package (`make bwrap`, or apt-get install bubblewrap)"


class BwrapSandboxes(SandboxHost):
    """Sandboxes in bubblewrap namespaces on this machine (see the module docstring).

    :param state_dir: where the labels live (``<state_dir>/bwrap``).
    :param max_sandboxes: at most this many live sandboxes on this host (``sandbox_full``).
    :param work_mb: the size of each sandbox's tmpfs work dir.
    :param uid: the user commands run as (``gid`` its group).
    :param hide: host paths covered by an empty tmpfs in every sandbox (the root is
        readable: hide what a tool must not read even where the files allow it).
    :param max_output_bytes: stdout and stderr kept per command (the rest is dropped).
    :param die_with_parent: the sandbox dies with the thread that started it.
    :param track_owner: tell the sweeps whether the process that started a sandbox
        still runs (by its pid on this machine); ``False``: report it unknown, as a host
        serving islands on other machines must, so the sweeps decide by the head's
        fences and gone records alone (docs/agentic.md, "Sweeps").
    :param bwrap: the bubblewrap executable.
    """

    PLUGIN_NAME = "bwrap"
    ISOLATED = True

    def __init__(
        self,
        state_dir: Any,
        *,
        max_sandboxes: int = 64,
        work_mb: int = 64,
        uid: int = 65534,
        gid: int = 65534,
        hide: Sequence[str] = (),
        max_output_bytes: int = 1 << 20,
        die_with_parent: bool = True,
        track_owner: bool = True,
        bwrap: str = "bwrap",
        start_timeout_s: float = 10.0,
    ) -> None:
        self.dir = Path(state_dir) / self.PLUGIN_NAME
        self.max_sandboxes, self.work_mb = int(max_sandboxes), int(work_mb)
        self.uid, self.gid, self.hide = int(uid), int(gid), tuple(hide)
        self.max_output_bytes, self.die_with_parent = int(max_output_bytes), die_with_parent
        self.bwrap, self.start_timeout_s = bwrap, float(start_timeout_s)
        self.track_owner = bool(track_owner)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    # -- state ---------------------------------------------------------------------------

    def _entry(self, sandbox_id: str) -> Optional[dict[str, Any]]:
        try:
            return json.loads((self.dir / f"{sandbox_id}.json").read_text())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _live(entry: Mapping[str, Any]) -> bool:
        return (
            procs.alive(entry["init_pid"], entry["init_start"])
            and procs.pid_ns(entry["init_pid"]) == entry["ns"]
        )

    # -- the port ------------------------------------------------------------------------

    def start(self, labels: Mapping[str, str]) -> str:
        exe = shutil.which(self.bwrap)
        if exe is None:
            raise SandboxFailure("sandbox_host_down", f"{self.bwrap} not found: {INSTALL_HINT}")
        if os.geteuid() != 0:
            raise SandboxFailure(
                "sandbox_host_down",
                f"the bwrap host needs root (this process runs as uid {os.geteuid()}): each "
                "command enters its sandbox with nsenter and drops to an unprivileged user; "
                "run the sampler islands as root (a container's root will do) or use the "
                "docker or modal host",
            )
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SandboxFailure("sandbox_host_down", f"cannot create {self.dir}: {exc}") from None
        with self._lock:
            held = sum(1 for e in self._entries() if self._live(e))
            if held >= self.max_sandboxes:
                raise SandboxFailure(
                    "sandbox_full",
                    f"{held} live sandboxes on this host, its limit "
                    f"([sandbox] options.max_sandboxes) is {self.max_sandboxes}",
                )
            sandbox_id = uuid.uuid4().hex[:16]
            entry = self._launch(exe, sandbox_id, labels)
            path = self.dir / f"{sandbox_id}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(entry))
            os.replace(tmp, path)
        return sandbox_id

    def _launch(self, exe: str, sandbox_id: str, labels: Mapping[str, str]) -> dict[str, Any]:
        argv = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        for path in self.hide:
            argv += ["--tmpfs", str(path)]
        argv += ["--size", str(self.work_mb << 20), "--perms", "1777", "--tmpfs", WORK_DIR]
        argv += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        argv += ["--new-session", "--as-pid-1", "--chdir", WORK_DIR]
        if self.die_with_parent:
            argv.append("--die-with-parent")
        r, w = os.pipe()
        log_path = self.dir / f"{sandbox_id}.log"
        try:
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [*argv, "--info-fd", str(w), "--", "sleep", "infinity"],
                    pass_fds=(w,),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=COMMAND_ENV,
                    # a session of its own: a sandbox left by a killed island is not in the
                    # island's process group, which its launcher watches to tell it exited
                    start_new_session=True,
                )
        except OSError as exc:
            os.close(r)
            raise SandboxFailure("sandbox_host_down", f"cannot run {exe}: {exc}") from None
        finally:
            os.close(w)
        try:
            init_pid = _read_child_pid(r, self.start_timeout_s)
        except BaseException:
            proc.kill()  # nothing records this sandbox: it must not outlive the failed start
            proc.wait()
            raise
        finally:
            os.close(r)
        if init_pid is not None and not _exec_done(init_pid, self.start_timeout_s):
            init_pid = None  # it never finished setting the sandbox up
        if init_pid is None:
            proc.kill()
            proc.wait()
            said = log_path.read_text(errors="replace").strip()[-500:]
            log_path.unlink(missing_ok=True)
            raise SandboxFailure(
                "sandbox_host_down",
                f"bwrap did not start a sandbox (within {self.start_timeout_s:g} s) "
                f"(exit code {proc.returncode}): {said or 'no message'}",
            ) from None
        self._procs[sandbox_id] = proc
        owner = os.getpid()
        return {
            "id": sandbox_id,
            "labels": dict(labels),
            "bwrap_pid": proc.pid,
            "bwrap_start": procs.start_time(proc.pid),
            "init_pid": init_pid,
            "init_start": procs.start_time(init_pid),
            "ns": procs.pid_ns(init_pid),
            "owner_pid": owner,
            "owner_start": procs.start_time(owner),
            "created": time.time(),
        }

    def run(self, sandbox_id: str, argv: list[str], limits: SandboxLimits) -> SandboxResult:
        entry = self._entry(sandbox_id)
        if entry is None or not self._live(entry):
            return SandboxResult("sandbox_gone", detail=f"sandbox {sandbox_id} is not running")
        cpu = max(1, math.ceil(limits.cpu_s))
        wrapped = [
            "prlimit",
            f"--cpu={cpu}:{cpu + 1}",
            f"--as={int(limits.memory_mb) << 20}",
            "--",
            "nsenter",
            "-t",
            str(entry["init_pid"]),
            "-m",
            "-p",
            "-n",
            "-i",
            "-u",
            "-r",
            "-w",
            "-S",
            str(self.uid),
            "-G",
            str(self.gid),
            "--",
            "setpriv",
            "--no-new-privs",
            "--",
            *argv,
        ]
        keep = frozenset({entry["init_pid"]})

        def kill_rest() -> None:  # nothing a command starts outlives it
            if self._live(entry):  # (a namespace id is reused once its namespace ended)
                procs.clear(entry["ns"], keep)

        return procs.run_limited(
            wrapped, limits, cap=self.max_output_bytes, kill_rest=kill_rest, env=COMMAND_ENV
        )

    def list(self, selector: Mapping[str, str]) -> list[SandboxInfo]:
        out = []
        for entry in self._entries():
            labels = entry.get("labels") or {}
            if all(labels.get(k) == v for k, v in selector.items()):
                owner = (
                    procs.alive(entry["owner_pid"], entry.get("owner_start"))
                    if self.track_owner
                    else None
                )
                out.append(SandboxInfo(entry["id"], dict(labels), owner_alive=owner))
        return out

    def _entries(self) -> list[dict[str, Any]]:
        if not self.dir.is_dir():
            return []
        found = []
        for path in sorted(self.dir.glob("*.json")):
            entry = self._entry(path.stem)
            if entry is not None:
                found.append(entry)
        return found

    def remove(self, sandbox_id: str) -> bool:
        entry = self._entry(sandbox_id)
        if entry is None:
            return True
        if self._live(entry):
            # PID 1 of the namespace: when it ends the kernel kills every process in the
            # namespace, and PID 1 has ended only once they all have
            try:
                os.kill(entry["init_pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc = self._procs.pop(sandbox_id, None)
        if proc is not None:
            proc.kill()
            proc.wait()
        elif procs.alive(entry["bwrap_pid"], entry.get("bwrap_start")):
            _kill_if_bwrap(entry["bwrap_pid"])  # started by an earlier process
        deadline = time.monotonic() + 10.0
        while procs.alive(entry["init_pid"], entry["init_start"]):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        (self.dir / f"{sandbox_id}.json").unlink(missing_ok=True)
        (self.dir / f"{sandbox_id}.log").unlink(missing_ok=True)
        return True


def _read_child_pid(fd: int, timeout_s: float) -> Optional[int]:
    """The ``child-pid`` of bwrap's ``--info-fd`` JSON (written in parts: read to its end)."""
    deadline = time.monotonic() + timeout_s
    data = b""
    # poll, not select: a process with many files open hands out descriptors past 1024
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while True:
        left = deadline - time.monotonic()
        ready = poller.poll(max(0, int(left * 1000)))
        chunk = os.read(fd, 65536) if ready else b""
        data += chunk
        try:
            return int(json.loads(data)["child-pid"])
        except (ValueError, KeyError, TypeError):
            if not chunk or left <= 0:
                return None


def _exec_done(pid: int, timeout_s: float) -> bool:
    """Wait until the sandbox's PID 1 runs ``sleep`` (bwrap reports its pid before the
    mounts are done; a command entering earlier would see a half-built root)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0", 1)[0] == b"sleep":
                    return True
        except OSError:
            return False
        time.sleep(0.002)
    return False


def _kill_if_bwrap(pid: int) -> None:
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return
    if exe == "bwrap":
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
