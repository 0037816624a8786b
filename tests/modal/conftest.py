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

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import pytest

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


@pytest.fixture
def volume_service() -> VolumeService:
    return VolumeService()


@pytest.fixture
def volume_double():
    """(VolumeService, VolumeSeamDouble) classes for tests that build several."""
    return VolumeService, VolumeSeamDouble


# -- function calls ------------------------------------------------------------------------


class CallService:
    """Modal's function calls, each a container process running the real body via .local().

    Faults: ``refuse_next`` (spawn raises), ``lose(call_id)`` (the service forgets the
    call: from_id raises), ``preempt(call_id)`` (the container dies; its input ends
    TERMINATED), ``time_out(call_id)`` (the container is killed at its timeout).
    """

    def __init__(self, workdir: Path, python: str = sys.executable) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.python = python
        self.calls: dict[str, dict[str, Any]] = {}
        self.refuse_next = 0
        self.deployed: list[Any] = []
        self.cancelled: list[tuple[str, bool]] = []
        self._ids = itertools.count(1)
        self.lock = threading.Lock()

    # seam interface ----------------------------------------------------------------------

    def deploy(self, built: Any) -> None:
        self.deployed.append(built)

    def spawn(self, built: Any, function: str, env: dict[str, str]) -> str:
        if self.refuse_next:
            self.refuse_next -= 1
            raise RuntimeError("ResourceExhaustedError: no GPU capacity in the requested region")
        call_id = f"fc-{next(self._ids):08d}{os.getpid()}"
        spec = {"config": built.config_json, "function": function, "env": env}
        spec_path = self.workdir / f"{call_id}.json"
        spec_path.write_text(json.dumps(spec))
        log = open(self.workdir / f"{call_id}.log", "ab")
        proc = subprocess.Popen(
            [self.python, "-m", "yeto_modal.local", str(spec_path)],
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        with self.lock:
            self.calls[call_id] = {"proc": proc, "status": None, "function": function}
        return call_id

    def poll(self, call_id: str) -> tuple[str, str]:
        with self.lock:
            call = self.calls.get(call_id)
        if call is None or call.get("lost"):
            return "missing", "the service has no such call"
        if call["status"] is not None:
            return call["status"]
        code = call["proc"].poll()
        if code is None:
            return "pending", ""
        return ("success", "") if code == 0 else ("failure", f"exit code {code}")

    def cancel(self, call_id: str, terminate_containers: bool) -> None:
        with self.lock:
            call = self.calls.get(call_id)
        self.cancelled.append((call_id, terminate_containers))
        if call is None or call.get("lost"):
            raise LookupError(f"NotFoundError: function call {call_id} not found")
        if terminate_containers:
            self._kill(call, ("terminated", "cancelled"))

    # faults ------------------------------------------------------------------------------

    def _kill(self, call: dict[str, Any], status: tuple[str, str]) -> None:
        proc = call["proc"]
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=30)
        if call["status"] is None:
            call["status"] = status

    def preempt(self, call_id: str) -> None:
        self._kill(self.calls[call_id], ("terminated", "container preempted"))

    def time_out(self, call_id: str) -> None:
        self._kill(self.calls[call_id], ("timeout", "function timed out"))

    def lose(self, call_id: str) -> None:
        self._kill(self.calls[call_id], ("terminated", "lost"))
        self.calls[call_id]["lost"] = True

    def running(self) -> list[str]:
        return [c for c, v in self.calls.items() if v["proc"].poll() is None]

    def stop_all(self) -> None:
        for call in self.calls.values():
            self._kill(call, ("terminated", "test teardown"))


@pytest.fixture
def call_service(tmp_path):
    service = CallService(tmp_path / "containers")
    yield service
    service.stop_all()


@pytest.fixture
def wait_until():
    def wait(predicate, timeout_s: float = 60.0, what: str = "condition"):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")

    return wait
