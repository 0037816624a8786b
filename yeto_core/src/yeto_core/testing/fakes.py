"""Shared test doubles: a clock, an engine, a task, island processes, launch records, a
follower of an engine's version, a directory store that looks remote, and a sampler
loop wired from them.

Each double implements its port (``yeto_core.ports``) and nothing more, so the
core calls it exactly as it calls a real plugin. The in-memory buffer and the
fake trainer backend are in :mod:`yeto_core.testing.fake_backend`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np

from yeto_core.ports import IslandProvider, ObjectStore, SamplerEngine, Task
from yeto_core.ports.store import SleepWatch, Watch
from yeto_core.providers.env import island_launch
from yeto_core.records import (
    Completion,
    Event,
    IslandLaunch,
    IslandStatus,
    LocalRelease,
    SamplingParams,
)
from yeto_core.sampler.interfaces import Follower
from yeto_core.stores.dir_store import DirStore


class Clock:
    """A settable clock: ``clock()`` returns ``clock.t``; :meth:`advance` and :meth:`sleep` move it.

    :param t: the start time.
    :param tick: every call first moves the clock by this much (0: it stands still).
    """

    def __init__(self, t: float = 0.0, *, tick: float = 0.0) -> None:
        self.t = float(t)
        self.tick = float(tick)
        self.sleeps = 0

    def __call__(self) -> float:
        self.t += self.tick
        return self.t

    def advance(self, dt: float) -> float:
        self.t += float(dt)
        return self.t

    def sleep(self, dt: float) -> None:
        """A ``sleep`` that only moves this clock (and counts the calls)."""
        self.sleeps += 1
        self.advance(dt)


class WeightFileEngine(SamplerEngine):
    """Serves the bytes of ``w.bin`` of the loaded release; its checksum is read back.

    ``generate`` answers each prompt with ``n`` one-token completions ``"0"``,
    ``"1"``, ... stamped with the served version.
    """

    PLUGIN_NAME = "weight-file"

    def __init__(self, **options: Any) -> None:
        self.weights, self.version = b"base", 0
        self._prev: Optional[tuple[bytes, int]] = None
        self.loads = 0

    def load_release(self, release: LocalRelease) -> None:
        self._prev = (self.weights, self.version)
        self.weights = (Path(release.path) / "w.bin").read_bytes()
        self.version = release.version
        self.loads += 1

    def rollback(self) -> None:
        assert self._prev is not None, "rollback without a load"
        self.weights, self.version = self._prev

    def served_checksum(self) -> str:
        return hashlib.sha256(self.weights).hexdigest()

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(int(i)) for i in ids)

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        return [
            [
                Completion(
                    tokens=np.array([48 + k], dtype=np.int64),
                    logprobs=np.array([-0.5], dtype=np.float32),
                    weight_version=self.version,
                )
                for k in range(n)
            ]
            for _ in prompts
        ]


class DigitsTask(Task):
    """Prompt ``p<i>``, answer ``str(i % 4)``; reward 1 for the exact answer."""

    PLUGIN_NAME = "digits"

    def __init__(self, **options: Any) -> None:
        pass

    def prompt(self, index: int) -> tuple[str, str]:
        return f"p{index}", str(index % 4)

    def reward(self, answer: str, completion: str) -> float:
        return 1.0 if completion == answer else 0.0


class ScriptIslands(IslandProvider):
    """Each launch runs ``python SCRIPT ARGS...`` with this environment plus the launch's env.

    :param script: the island's script.
    :param args: its arguments.
    :param wait_s: how long :meth:`release` waits for a process to exit by itself (an agent
        exits after answering its drain) before it kills it.
    """

    PLUGIN_NAME = "script"

    def __init__(self, script: Path, *args: str, wait_s: float = 30.0) -> None:
        self.script, self.args, self.wait_s = script, tuple(args), wait_s
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.launches: list[IslandLaunch] = []

    def launch(self, launch: IslandLaunch) -> str:
        p = subprocess.Popen(
            [sys.executable, str(self.script), *self.args], env={**os.environ, **launch.env}
        )
        handle = f"{launch.handle}-{p.pid}"
        self.procs[handle] = p
        self.launches.append(launch)
        return handle

    def status(self, handle: str) -> IslandStatus:
        p = self.procs.get(handle)
        if p is None:
            return IslandStatus.GONE
        return IslandStatus.RUNNING if p.poll() is None else IslandStatus.EXITED

    def events(self, handle: str) -> Iterator[Event]:
        return iter(())

    def release(self, handle: str) -> bool:
        p = self.procs.get(handle)
        if p is None:
            return True  # not launched by this provider: nothing to stop
        try:
            p.wait(timeout=self.wait_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
        return p.poll() is not None

    def orphans(self) -> list[str]:
        return []

    def returncode(self, handle: str) -> Optional[int]:
        p = self.procs.get(handle)
        return None if p is None else p.poll()


def launch_for(
    store: ObjectStore, island: str = "trainer", *, role: str = "trainer", incarnation: int = 0
) -> IslandLaunch:
    """A launch record for ``island`` of a test run (``run_id`` ``"test"``)."""
    return island_launch(store, run_id="test", role=role, island=island, incarnation=incarnation)


class RemoteLookingDirStore(DirStore):
    """A ``dir`` store that looks remote, as an S3-compatible one does to the core: no
    local files (``local_root()`` is None, so the buffer takes its ``objects`` layout
    and the read-aheads and overlaps of remote stores run) and no notifications (its
    watch sleeps, as the port's default). ``remote=False`` gives back the local files
    (the same test on a local store). Not fsynced by default. Subclass it to record or
    fail requests."""

    def __init__(self, root: Any, *, remote: bool = True, fsync: bool = False) -> None:
        super().__init__(root, fsync=fsync)
        self.remote = remote

    def local_root(self) -> Optional[Path]:
        return None if self.remote else super().local_root()

    def watch(self, prefix: str) -> Watch:
        return SleepWatch()


class EngineFollower(Follower):
    """The policy follower a :class:`~yeto_core.sampler.loop.SamplerLoop` reads, serving
    ``engine.version`` (a test loads versions into the engine by hand, e.g. behind the
    trainer); no release is ever fetched, so no load is recorded or waited for (the
    :class:`~yeto_core.sampler.interfaces.Follower` defaults)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.last_round_straddled = False

    @property
    def version(self) -> Any:
        return self.engine.version

    @contextlib.contextmanager
    def round(self) -> Iterator[int]:
        yield self.engine.version


def digits_sampler(buffer: Any, *, engine: Any = None, **options: Any) -> Any:
    """A :class:`~yeto_core.sampler.loop.SamplerLoop` of :class:`DigitsTask` on ``buffer``,
    serving ``engine`` (a new :class:`WeightFileEngine` when None) through an
    :class:`EngineFollower`: host ``h``, incarnation 0, groups of 2, 4 prompts a call,
    default sampling; ``options`` (any of the loop's keywords) add or override."""
    from yeto_core.sampler.loop import SamplerLoop

    engine = WeightFileEngine() if engine is None else engine
    kw: dict[str, Any] = {
        "host": "h",
        "incarnation": 0,
        "group_size": 2,
        "prompts_per_call": 4,
        "sampling": SamplingParams(),
        **options,
    }
    return SamplerLoop(buffer, engine, DigitsTask(), EngineFollower(engine), **kw)
