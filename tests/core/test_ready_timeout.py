"""``[trainer] ready_timeout_s``: a trainer stuck starting ends as a failed start
(issue 52 item 3); the remote lifecycle's answer timeout is ``[trainer] answer_timeout_s``.

The head runs the real :class:`TrainerLoop`, S1 and :class:`RemoteTrainerLifecycle` on a
simulated clock; the provider launches islands that never report ``ready``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from yeto_core.config.load import load_config
from yeto_core.errors import ConfigError
from yeto_core.ports import IslandProvider
from yeto_core.records import Backlog, Event, IslandStatus, LifecycleState
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_run import fake_head, fake_run_config
from yeto_core.testing.fakes import Clock, launch_for
from yeto_core.trainer.lifecycle import RemoteTrainerLifecycle
from yeto_core.trainer.loop import Journal, LoopConfig, TrainerLoop, TrainerLoopGaveUp
from yeto_core.trainer.s1 import S1Scheduler

S = LifecycleState


class NeverReady(IslandProvider):
    """Launches islands that stay running and never answer (a start stuck provisioning)."""

    PLUGIN_NAME = "never-ready"

    def __init__(self) -> None:
        self.launched: list[str] = []
        self.released: list[str] = []

    def launch(self, launch) -> str:
        self.launched.append(f"{launch.handle}")
        return self.launched[-1]

    def status(self, handle: str) -> IslandStatus:
        return IslandStatus.GONE if handle in self.released else IslandStatus.RUNNING

    def events(self, handle: str) -> Iterator[Event]:
        return iter(())

    def release(self, handle: str) -> bool:
        self.released.append(handle)
        return True

    def orphans(self) -> list[str]:
        return []


def test_a_trainer_stuck_starting_is_a_failed_start_after_ready_timeout_s(tmp_path):
    clock = Clock(1000.0)
    store = DirStore(tmp_path / "store", fsync=False)
    provider = NeverReady()
    lifecycle = RemoteTrainerLifecycle(
        store, provider, launch_for(store), poll_s=0.0, sleep=lambda s: None
    )
    journal = Journal(store)
    loop = TrainerLoop(
        S1Scheduler(),
        lifecycle,
        lambda: Backlog(0, 0, 0, 0),
        lambda: False,  # no release yet: S1 starts for the first policy
        journal,
        LoopConfig(groups_per_round=2, a_hard=2, max_failures=2, first_policy_start=True),
        clock=clock,
        ready_timeout_s=100.0,
    )
    loop.tick()
    assert lifecycle.state() == S.STARTING and len(provider.launched) == 1
    clock.advance(100.0)
    loop.tick()  # at the limit, not past it: still waiting
    assert lifecycle.state() == S.STARTING and provider.released == []
    clock.advance(0.5)
    loop.tick()
    kinds = [r["kind"] for r in journal.read()]
    timeout = next(r for r in journal.read() if r["kind"] == "ready_timeout")
    assert timeout["incarnation"] == 0 and timeout["ready_timeout_s"] == 100.0
    assert timeout["waited_s"] == pytest.approx(100.5)
    release = next(r for r in journal.read() if r["kind"] == "release")
    assert release["failed"] is True and release["failures"] == 1
    assert kinds.index("ready_timeout") < kinds.index("release")
    assert provider.released == provider.launched[:1]  # the stuck island is released
    # the failed-start path goes on: another incarnation starts at once ...
    assert len(provider.launched) == 2 and lifecycle.state() == S.STARTING
    clock.advance(100.5)
    # ... and max_failures stuck starts in a row give up, as starts that fail do
    with pytest.raises(TrainerLoopGaveUp):
        loop.tick()
    assert provider.released == provider.launched
    assert [r["kind"] for r in journal.read()].count("ready_timeout") == 2


def test_the_head_gives_the_config_timeouts_to_the_loop_and_the_remote_lifecycle(tmp_path):
    config = fake_run_config(tmp_path)
    assert config.trainer.ready_timeout_s == 1800.0 and config.trainer.answer_timeout_s == 600.0
    import attrs

    trainer = attrs.evolve(config.trainer, ready_timeout_s=42.0, answer_timeout_s=7.0)
    head = fake_head(attrs.evolve(config, trainer=trainer))
    head.build_trainer_loop()
    assert head.trainer_loop.ready_timeout_s == 42.0
    assert isinstance(head.lifecycle, RemoteTrainerLifecycle)
    assert head.lifecycle.timeout_s == 7.0


GOOD = """
name = "rt"
run_dir = "run"
[model]
path = "model"
[task]
name = "t"
[[samplers]]
engine = "e"
[trainer]
backend = "b"
"""


@pytest.mark.parametrize(
    "line, expected",
    [
        ("ready_timeout_s = 0", "trainer.ready_timeout_s = 0"),
        ("ready_timeout_s = -5.0", "trainer.ready_timeout_s = -5.0"),
        ('answer_timeout_s = "long"', "trainer.answer_timeout_s"),
        ("answer_timeout_s = nan", "trainer.answer_timeout_s = nan"),
    ],
)
def test_bad_timeouts_name_their_toml_path(tmp_path: Path, line: str, expected: str) -> None:
    path = tmp_path / "run.toml"
    path.write_text(GOOD + line + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert expected in str(info.value)


def test_timeouts_are_read(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(GOOD + "ready_timeout_s = 3600\nanswer_timeout_s = 90.5\n")
    t = load_config(path).trainer
    assert (t.ready_timeout_s, t.answer_timeout_s) == (3600, 90.5)
