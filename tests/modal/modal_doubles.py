"""Doubles of yeto-modal's two SDK seams, with Modal's documented semantics.

- :class:`VolumeService` stands for one Modal Volume on the service: SDK-side
  calls (``batch_upload``, ``read_file``, ``listdir``, ``remove_file``) act on
  the committed state at once; each container mount is a snapshot that sees
  other writers only after ``reload()``, publishes its own writes only on
  ``commit()``, and refuses ``reload()`` while one of its files is open
  (``RuntimeError`` with the service's message). A refused-overwrite upload
  checks and then writes, with nothing atomic between the two (Modal
  documents no atomic create), and ``race_window`` lets a test hold a writer
  between them.
- :class:`CallService` stands for Modal's function calls: ``spawn`` starts the
  real function body through ``Function.local()`` in its own process (a
  container), ``poll`` reads its state, ``cancel`` terminates it; a test can
  make it refuse a spawn, lose a call, preempt a container or time it out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

OPEN_FILES = "there are open files preventing the operation"


class VolumeService:
    """One Modal Volume: committed files, plus the mounts of running containers."""

    def __init__(self, name: str = "vol") -> None:
        self.name = name
        self.files: dict[str, bytes] = {}
        self.lock = threading.RLock()
        self.race_window: Optional[threading.Barrier] = None
        self.calls: list[tuple[str, str]] = []

    @staticmethod
    def norm(path: str) -> str:
        return "/" + path.strip("/")

    # SDK-side calls (what VolumeSeam makes) -------------------------------------------

    def upload(self, path: str, data: bytes, *, overwrite: bool) -> None:
        path = self.norm(path)
        self.calls.append(("upload", path))
        if not overwrite:
            with self.lock:
                exists = path in self.files
            if exists:
                raise FileExistsError(f"{path} already exists")
            if self.race_window is not None:
                self.race_window.wait(timeout=10)
        with self.lock:
            if any(k.startswith(path + "/") for k in self.files):
                raise IsADirectoryError(path)
            self.files[path] = bytes(data)

    def read(self, path: str) -> bytes:
        path = self.norm(path)
        with self.lock:
            if path not in self.files:
                raise FileNotFoundError(path)
            return self.files[path]

    def listdir(self, path: str) -> list[str]:
        base = self.norm(path).rstrip("/") + "/"
        with self.lock:
            # listdir paths are relative to the volume root, without a leading "/"
            return [k[1:] for k in self.files if base == "/" or k.startswith(base)]

    def remove(self, path: str) -> None:
        path = self.norm(path)
        with self.lock:
            if self.files.pop(path, None) is None:
                raise FileNotFoundError(path)

    def mount(self) -> Mount:
        return Mount(self)


class Mount:
    """A container's view of the volume: a snapshot plus its own uncommitted writes."""

    def __init__(self, service: VolumeService) -> None:
        self.service = service
        with service.lock:
            self.view = dict(service.files)
        self.dirty: dict[str, Optional[bytes]] = {}
        self.open_files = 0

    @contextmanager
    def open(self, path: str):
        self.open_files += 1
        try:
            yield self.view.get(VolumeService.norm(path))
        finally:
            self.open_files -= 1

    def write(self, path: str, data: bytes) -> None:
        path = VolumeService.norm(path)
        self.view[path] = data
        self.dirty[path] = data

    def read(self, path: str) -> bytes:
        return self.view[VolumeService.norm(path)]

    def commit(self) -> None:
        with self.service.lock:
            for path, data in self.dirty.items():
                if data is None:
                    self.service.files.pop(path, None)
                else:
                    self.service.files[path] = data  # last write wins
            self.dirty.clear()
        self.reload()

    def reload(self) -> None:
        if self.open_files:
            raise RuntimeError(OPEN_FILES)
        with self.service.lock:
            for path, data in self.dirty.items():  # uncommitted changes may be committed
                self.service.files[path] = data  # type: ignore[assignment]
            self.dirty.clear()
            self.view = dict(self.service.files)


class VolumeSeamDouble:
    """The double behind yeto_modal.volume.VolumeSeam's interface."""

    def __init__(self, service: VolumeService, mount: Optional[Mount] = None) -> None:
        self.service, self.mount, self.name = service, mount, service.name

    def upload(self, path: str, data: bytes, *, overwrite: bool) -> None:
        self.service.upload(path, data, overwrite=overwrite)

    def read(self, path: str) -> bytes:
        return self.service.read(path)

    def files(self, path: str) -> list[str]:
        return self.service.listdir(path)

    def remove(self, path: str) -> None:
        self.service.remove(path)

    def reload(self) -> None:
        assert self.mount is not None, "reload() runs only inside a container that mounts it"
        self.mount.reload()

    def commit(self) -> None:
        assert self.mount is not None, "commit() runs only inside a container that mounts it"
        self.mount.commit()


# -- function calls ------------------------------------------------------------------------


class CallService:
    """Modal's function calls, each a container process running the real body via .local().

    The service's state is on disk (``<root>/<call_id>.json``), so a head that is
    killed and restarted talks to the same service, as with Modal. A container is
    a process group running ``python -m yeto_modal.local`` (the function's real
    body through ``Function.local()``) with the call's arguments and the
    function's Secret in its environment; it writes its exit code when it ends.

    Faults: ``refuse_next`` (spawn raises), ``lose(call_id)`` (the service
    forgets the call), ``preempt(call_id)`` (the container dies; its input ends
    TERMINATED), ``time_out(call_id)`` (killed at its timeout: TIMEOUT).
    """

    def __init__(self, root: Path, command: Optional[list[str]] = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.command = command
        self.refuse_next = 0
        self.deployed: list[Any] = []
        self.cancelled: list[tuple[str, bool]] = []
        self.polls = 0
        self.ignore_cancel = False  # a cancel the service accepts but never carries out

    def _rec_path(self, call_id: str) -> Path:
        return self.root / f"{call_id}.json"

    def _rec(self, call_id: str) -> Optional[dict[str, Any]]:
        try:
            return json.loads(self._rec_path(call_id).read_text())
        except (OSError, ValueError):
            return None

    def _save(self, call_id: str, rec: dict[str, Any]) -> None:
        tmp = self._rec_path(call_id).with_suffix(".tmp")
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, self._rec_path(call_id))

    # seam interface ----------------------------------------------------------------------

    def deploy(self, built: Any) -> None:
        self.deployed.append(built)

    def spawn(self, built: Any, function: str, env: dict[str, str]) -> str:
        if self.refuse_next:
            self.refuse_next -= 1
            raise RuntimeError("ResourceExhaustedError: no GPU capacity in the requested region")
        call_id = f"fc-{os.getpid()}x{time.monotonic_ns()}"
        spec_path = self.root / f"{call_id}.spec"
        spec_path.write_text(
            json.dumps({"config": built.config_json, "function": function, "env": env})
        )
        exit_path = self.root / f"{call_id}.exit"
        cmd = self.command or [sys.executable, "-m", "yeto_modal.local", str(spec_path)]
        script = " ".join(f"'{c}'" for c in cmd) + f'; echo $? > "{exit_path}"'
        workdir = self.root / call_id
        workdir.mkdir()  # the container's own empty disk
        with open(self.root / f"{call_id}.log", "ab") as log:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", script],
                cwd=workdir,
                env={
                    "PATH": os.environ.get("PATH", ""),
                    **_python_env(),
                    **built.secret_env,
                    **env,
                },
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._save(call_id, {"pgid": proc.pid, "function": function, "status": None})
        return call_id

    def poll(self, call_id: str) -> tuple[str, str]:
        self.polls += 1
        rec = self._rec(call_id)
        if rec is None or rec.get("lost"):
            return "missing", "NotFoundError: the service has no such call"
        if rec["status"] is not None:
            return tuple(rec["status"])  # type: ignore[return-value]
        exit_path = self.root / f"{call_id}.exit"
        if exit_path.exists() and not _group_alive(rec["pgid"]):
            code = int(exit_path.read_text().strip() or 1)
            return ("success", "") if code == 0 else ("failure", f"the body raised (exit {code})")
        if not _group_alive(rec["pgid"]):
            return "terminated", "the container died"
        return "pending", ""

    def cancel(self, call_id: str, terminate_containers: bool) -> None:
        self.cancelled.append((call_id, terminate_containers))
        (self.root / f"{call_id}.cancelled").write_text(json.dumps(terminate_containers))
        rec = self._rec(call_id)
        if rec is None or rec.get("lost"):
            raise LookupError(f"NotFoundError: function call {call_id} not found")
        if terminate_containers and not self.ignore_cancel:
            self._kill(call_id, ["terminated", "cancelled"])

    # faults ------------------------------------------------------------------------------

    def _kill(self, call_id: str, status: list[str], lost: bool = False) -> None:
        rec = self._rec(call_id)
        assert rec is not None, call_id
        try:
            os.killpg(rec["pgid"], 9)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 30
        while _group_alive(rec["pgid"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        if rec["status"] is None and not (self.root / f"{call_id}.exit").exists():
            rec["status"] = status
        rec["lost"] = lost or rec.get("lost", False)
        self._save(call_id, rec)

    def preempt(self, call_id: str) -> None:
        self._kill(call_id, ["terminated", "container preempted"])

    def time_out(self, call_id: str) -> None:
        self._kill(call_id, ["timeout", "FunctionTimeoutError: the call exceeded its timeout"])

    def lose(self, call_id: str) -> None:
        self._kill(call_id, ["terminated", "lost"], lost=True)

    def calls(self) -> list[str]:
        return sorted(p.stem for p in self.root.glob("fc-*.json"))

    def running(self) -> list[str]:
        return [c for c in self.calls() if self.poll(c)[0] == "pending"]

    def function_of(self, call_id: str) -> str:
        rec = self._rec(call_id)
        return rec["function"] if rec else ""

    def stop_all(self) -> None:
        for call_id in self.calls():
            rec = self._rec(call_id)
            if rec and _group_alive(rec["pgid"]):
                self._kill(call_id, ["terminated", "test teardown"])


def _python_env() -> dict[str, str]:
    keep = (
        "PYTHONPATH",
        "HOME",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "TOKENIZERS_PARALLELISM",
    )
    return {k: os.environ[k] for k in keep if k in os.environ}


def _group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process is in group ``pgid``.

    The group's leader (pid ``pgid``, the container's shell) is asked first: while it
    lives, the group does, and the head polls each call several times a tick, so a
    scan of every process (~15 ms on a busy machine) only runs once the leader is gone.
    """
    if _alive_in(Path(f"/proc/{pgid}"), pgid):
        return True
    return any(_alive_in(entry, pgid) for entry in Path("/proc").iterdir() if entry.name.isdigit())


def _alive_in(entry: Path, pgid: int) -> bool:
    """Whether process ``entry`` (a /proc folder) is alive and in group ``pgid``."""
    try:
        stat = (entry / "stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0] != "Z" and fields[2] == str(pgid)
