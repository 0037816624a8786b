"""The remote lifecycle: the head drives a trainer island through a channel in the store.

``RemoteTrainerLifecycle`` (head side) launches each incarnation through an island
provider and sends commands; ``IslandTrainerAgent`` (island side) wraps a
:class:`~yeto_core.trainer.lifecycle.driver.DriverLifecycle` and answers them. Channel keys
(one object per message, so that any object store can hold it)::

    trainer/<incarnation>/commands/<seq:08d>.json   head -> trainer (put_if_absent)
    trainer/<incarnation>/events/<seq:08d>.json     trainer -> head (put_if_absent)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any, Optional

import attrs

from yeto_core import serde
from yeto_core.errors import IllegalTransitionError, NotFoundError, StoreError, YetoError
from yeto_core.ports import (
    IslandProvider,
    LifecycleContext,
    ObjectStore,
    TrainerLifecycle,
)
from yeto_core.providers.env import relaunch
from yeto_core.records import (
    ConsistentCut,
    Event,
    IslandLaunch,
    LifecycleState,
    StopReason,
)
from yeto_core.stage_profile import stage
from yeto_core.stores.log import StoreLog
from yeto_core.trainer.lifecycle.driver import DriverLifecycle
from yeto_core.trainer.lifecycle.states import TRANSITIONS, StateMachine, TrainerFailedError

S = LifecycleState

#: While a train command's ``for_s`` runs, the trainer answers only early (at the data
#: end, with all its rounds trained, or failing, and a failed process is seen by its
#: provider's status anyway): the head reads the channel this often then, and every
#: ``poll_s`` once ``for_s`` has passed (on a remote store each read is a request).
QUIET_POLL_S = 0.5
#: ... and for at most this share of the command's rounds at the last seconds per round
#: (a command of few rounds ends before ``for_s``)
QUIET_ROUNDS_SHARE = 0.5
#: After its answer to a train command the trainer does not read the command channel for
#: this share of the shortest of the head's last three turns (answer to next command),
#: and for at most :data:`TURN_QUIET_MAX_S`: the head reads the answer, ticks and writes
#: the next command in about as long each time (on a remote store each read is a request)
TURN_QUIET_SHARE = 0.75
TURN_QUIET_MAX_S = 1.0


class Channel:
    """One direction of a trainer incarnation's channel: a :class:`StoreLog` of ``<seq:08d>.json``."""

    def __init__(
        self, store: ObjectStore, incarnation: int, name: str, prefix: str = "trainer"
    ) -> None:
        self.store = store
        self.base = f"{prefix}/{incarnation}/{name}"
        self._log = StoreLog(store, self.base, width=8)
        self._next_read = 0  # the sequence number of the next message to read

    def send(self, message: Mapping[str, Any]) -> int:
        """Write the next message; return its sequence number (one writer per direction)."""
        try:
            return self._log.append_exclusive(
                lambda seq: serde.dumps(dict(message, seq=seq)).encode()
            )
        except StoreError as exc:
            raise YetoError(f"{exc} (two writers on one trainer channel)") from None

    def receive(self) -> list[dict[str, Any]]:
        """Messages written since the last call, in order.

        Sequence numbers are dense (one writer, :meth:`send`), so the next message's key
        is known: a poll is one ``get`` of it (a miss: nothing new), not a listing of the
        channel (O(messages) on a store that filters listings itself).
        """
        out = []
        while True:
            try:
                data = self.store.get(self._log.key(self._next_read))
            except NotFoundError:
                return out
            out.append(json.loads(data))
            self._next_read += 1


class RemoteTrainerLifecycle(TrainerLifecycle):
    """Drives a trainer incarnation in another process through the store's channel.

    :param store: the run's object store (the channel lives there).
    :param provider: launches the trainer island (``launch``/``status``/``release``).
    :param launch: the trainer island's launch record; each incarnation launches it
        with its own incarnation number (and cut).
    :param timeout_s: how long ``train``/``drain`` (and ``wait_ready`` at shutdown) wait
        for the trainer's answer (``[trainer] answer_timeout_s``).
    :param sleep: waits between polls (injected).
    """

    PLUGIN_NAME = "remote"

    @classmethod
    def create(cls, context: LifecycleContext) -> RemoteTrainerLifecycle:
        return cls(
            context.store,
            context.provider,
            context.launch,
            timeout_s=float(context.config.trainer.answer_timeout_s),
            emit=context.emit,
        )

    def __init__(
        self,
        store: ObjectStore,
        provider: IslandProvider,
        launch: IslandLaunch,
        *,
        timeout_s: float = 600.0,
        poll_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        emit: Optional[Callable[[Event], None]] = None,
    ) -> None:
        self.store, self.provider, self.launch = store, provider, launch
        self.island = launch.island
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self._clock, self._sleep = clock, sleep
        self._emit = emit or (lambda e: None)
        self.sm = StateMachine("trainer lifecycle 'remote'")
        self._handle: Optional[str] = None
        self.incarnation: Optional[int] = None
        self.last_report: dict[str, Any] = {}
        self.start_summary: Optional[dict[str, Any]] = None
        self._commands: Optional[Channel] = None
        self._events: Optional[Channel] = None
        self._answers: dict[int, dict[str, Any]] = {}
        self._real_sleep = sleep is time.sleep
        self._answer_watch: Any = None
        #: seconds per round of the last train command that trained any
        self._round_s: Optional[float] = None

    def _pause(self) -> bool:
        """Until the trainer may have answered, at most ``poll_s``. :returns: whether the
        store's watch saw a change under the channel (False for a plain poll)."""
        if self._answer_watch is not None:
            return bool(self._answer_watch.wait(self.poll_s))
        self._sleep(self.poll_s)
        return False

    def start(self, incarnation: int, cut: Optional[Any] = None) -> None:
        self.sm.go(S.STARTING, "start")
        self.incarnation = incarnation
        self.start_summary = None  # this incarnation's, from its ``ready`` message
        self._commands = Channel(self.store, incarnation, "commands")
        self._events = Channel(self.store, incarnation, "events")
        if self._answer_watch is not None:
            self._answer_watch.close()
        # wake on the trainer's answers instead of sleeping poll_s (a real sleep only)
        self._answer_watch = self.store.watch(self._events.base) if self._real_sleep else None
        cut_id = None if cut is None else cut if isinstance(cut, str) else cut.cut_id
        self._handle = self.provider.launch(relaunch(self.launch, incarnation, cut_id))

    @property
    def handle(self) -> Optional[str]:
        return self._handle

    def report(self) -> Mapping[str, Any]:
        return self.last_report

    def _pump(self) -> None:
        assert self._events is not None
        for msg in self._events.receive():
            kind = msg.get("kind")
            self._emit(
                Event(
                    kind=f"remote_{kind}",
                    time=time.time(),
                    source=f"trainer-{self.incarnation}",
                    data=msg,
                )
            )
            if "counters" in msg:
                self.last_report = msg["counters"]
            if kind == "ready":
                self.start_summary = msg.get("summary")
                self.sm.go(S.READY, "ready")
            elif kind == "failed":
                if S.FAILED in TRANSITIONS[self.sm.state]:
                    self.sm.state = S.FAILED
            if "cmd" in msg:
                self._answers[int(msg["cmd"])] = msg

    def state(self) -> LifecycleState:
        if self.sm.state in (S.STOPPED, S.LEFT, S.FAILED):
            return self.sm.state
        self._pump()
        if (
            self.sm.state in (S.STARTING, S.READY, S.TRAINING, S.DRAINING)
            and self.handle is not None
        ):
            if self.provider.status(self.handle) in ("exited", "gone", "lost"):
                self._pump()  # a last answer may have landed before the exit
                if self.sm.state not in (S.LEFT, S.FAILED):
                    self.sm.state = S.FAILED
        return self.sm.state

    @property
    def start_seconds(self) -> Optional[float]:
        """The start seconds the trainer reported in its ``ready`` summary."""
        return (self.start_summary or {}).get("start_s")

    def _wait_answer(self, seq: int, what: str, quiet_s: float = 0.0) -> dict[str, Any]:
        """The trainer's answer to command ``seq``. For ``quiet_s`` seconds (a train
        command's ``for_s``, when it cannot answer sooner but early) the channel is read
        every :data:`QUIET_POLL_S`, or when the store's watch wakes, not every ``poll_s``;
        the provider's status is looked at every ``poll_s`` throughout."""
        began = self._clock()
        deadline = began + self.timeout_s
        quiet_until = began + quiet_s
        read_at = began if quiet_s <= 0 else began + min(QUIET_POLL_S, quiet_s)
        woken = False
        while True:
            now = self._clock()
            if woken or now >= read_at or now >= quiet_until:
                self._pump()
                read_at = now + QUIET_POLL_S
            if seq in self._answers:
                return self._answers.pop(seq)
            if self.sm.state == S.FAILED or (
                self.handle is not None
                and self.provider.status(self.handle) in ("exited", "gone", "lost")
            ):
                self._pump()
                if seq in self._answers:
                    return self._answers.pop(seq)
                self.sm.state = S.FAILED
                raise TrainerFailedError(
                    f"trainer incarnation {self.incarnation} died before answering {what}"
                )
            if self._clock() > deadline:
                self.sm.state = S.FAILED
                raise TrainerFailedError(
                    f"trainer incarnation {self.incarnation} did not answer {what} within {self.timeout_s} s; "
                    "release it and start another"
                )
            with stage("head.wait_answer"):
                woken = self._pause()

    def wait_ready(self) -> LifecycleState:
        """Block until the incarnation is READY (or FAILED / timed out)."""
        deadline = self._clock() + self.timeout_s
        while self.state() == S.STARTING:
            if self._clock() > deadline:
                self.sm.state = S.FAILED
                break
            self._pause()
        return self.sm.state

    def train(self, rounds: int, for_s: Optional[float] = None) -> int:
        self.sm.go(S.TRAINING, "train")
        assert self._commands is not None
        command: dict[str, Any] = {"op": "train", "rounds": rounds}
        if for_s is not None:
            command["for_s"] = float(for_s)
        quiet = 0.0 if for_s is None else float(for_s)
        if self._round_s is not None:
            quiet = min(quiet, QUIET_ROUNDS_SHARE * rounds * self._round_s)
        with stage("head.train_command"):
            sent = self._clock()
            seq = self._commands.send(command)
            answer = self._wait_answer(seq, f"train({rounds})", quiet_s=quiet)
        if answer.get("kind") == "failed":
            self.sm.state = S.FAILED
            raise TrainerFailedError(
                f"trainer incarnation {self.incarnation} failed: {answer.get('error')}"
            )
        self.sm.go(S.READY, "hold")
        done = int(answer["rounds"])
        if done > 0:
            self._round_s = (self._clock() - sent) / done
        return done

    def drain(self, reason: StopReason) -> ConsistentCut:
        self.sm.go(S.DRAINING, f"drain ({reason.value})")
        assert self._commands is not None
        seq = self._commands.send({"op": "drain", "reason": reason.value})
        answer = self._wait_answer(seq, f"drain({reason.value})")
        if answer.get("kind") != "left":
            self.sm.state = S.FAILED
            raise TrainerFailedError(
                f"trainer incarnation {self.incarnation} failed to drain: {answer.get('error')}"
            )
        self.sm.go(S.LEFT, "leave")
        return serde.structure(answer["cut"], ConsistentCut, what="remote cut")

    def release(self) -> None:
        if self.handle is not None and not self.provider.release(self.handle):
            raise YetoError(
                f"island {self.island} incarnation {self.incarnation} (handle {self.handle}) could not be "
                "verified gone; check the provider and release it by hand"
            )
        if self.sm.state not in (S.LEFT, S.FAILED):
            self.sm.state = S.FAILED
        self.sm.go(S.STOPPED, "release")
        self._handle = None

    def release_orphan(self, handle: str) -> bool:
        """Release an island a previous head launched (found in its journal)."""
        return self.provider.release(handle)


class IslandTrainerAgent:
    """The trainer side of the remote channel: wraps a :class:`DriverLifecycle`.

    It starts the driver, reports ``ready`` with the start summary, then follows
    commands in order: ``train`` (one round at a time, answering with the rounds
    trained and the counters) and ``drain`` (answering ``left`` with the cut, then
    exiting). Driver events are forwarded to the channel as ``event`` messages.
    """

    def __init__(
        self,
        store: ObjectStore,
        driver: DriverLifecycle,
        incarnation: int,
        *,
        poll_s: float = 0.02,
        idle_timeout_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.driver = driver
        self.incarnation = incarnation
        self.commands = Channel(store, incarnation, "commands")
        self.events = Channel(store, incarnation, "events")
        self.poll_s, self.idle_timeout_s = poll_s, idle_timeout_s
        self._clock, self._sleep = clock, sleep
        # wake on the head's next command instead of sleeping poll_s (a real sleep only)
        self._watch = store.watch(self.commands.base) if sleep is time.sleep else None
        #: when the last train answer went (None once the next command came), and the
        #: head's last three turns: answer to the next command seen (:meth:`_wait_s`)
        self._answered_at: Optional[float] = None
        self._turns: list[float] = []

    def _wait_s(self, now: float) -> float:
        """Seconds to wait before the next read of the command channel: ``poll_s``, or
        longer right after a train answer, until :data:`TURN_QUIET_SHARE` of the shortest
        of the head's last three turns has passed since (at most :data:`TURN_QUIET_MAX_S`).
        A store's watch that wakes ends the wait sooner."""
        if self._answered_at is None or len(self._turns) < 3:
            return self.poll_s
        quiet = min(TURN_QUIET_SHARE * min(self._turns), TURN_QUIET_MAX_S)
        return max(self.poll_s, quiet - (now - self._answered_at))

    def _command_seen(self, now: float) -> None:
        if self._answered_at is not None:
            self._turns = [*self._turns[-2:], now - self._answered_at]
            self._answered_at = None

    def _counters(self) -> dict[str, Any]:
        return attrs.asdict(self.driver.counters)

    def run(self, cut: Optional[str] = None) -> Optional[ConsistentCut]:
        try:
            return self._run(cut)
        finally:
            # closed here, not by the garbage collector: a SIGTERM from the head after
            # the trainer left would otherwise raise inside the watch's finalizer
            # (a traceback in the island's log, the signal's exception swallowed)
            if self._watch is not None:
                self._watch.close()

    def _run(self, cut: Optional[str]) -> Optional[ConsistentCut]:
        try:
            self.driver.start(self.incarnation, cut)
        except TrainerFailedError as exc:
            self.events.send({"kind": "failed", "error": str(exc)})
            raise
        summary = {
            "start_s": self.driver.start_seconds,  # from the submission when stamped
            "cut_id": self.driver.restored_cut.cut_id if self.driver.restored_cut else None,
        }
        self.events.send({"kind": "ready", "summary": summary, "counters": self._counters()})
        idle_since = self._clock()
        while True:
            with stage("agent.receive"):
                cmds = self.commands.receive()
            if not cmds:
                now = self._clock()
                if now - idle_since > self.idle_timeout_s:
                    self.events.send(
                        {"kind": "failed", "error": "no command within idle_timeout_s"}
                    )
                    return None
                with stage("agent.wait_command"):
                    if self._watch is not None:
                        self._watch.wait(self._wait_s(now))
                    else:
                        self._sleep(self._wait_s(now))
                continue
            idle_since = self._clock()
            self._command_seen(idle_since)
            for cmd in cmds:
                op = cmd.get("op")
                try:
                    if op == "train":
                        with stage("agent.train"):
                            for_s = cmd.get("for_s")
                            done = self.driver.train(
                                int(cmd["rounds"]), None if for_s is None else float(for_s)
                            )
                        self.events.send(
                            {
                                "kind": "trained",
                                "cmd": cmd["seq"],
                                "rounds": done,
                                "counters": self._counters(),
                            }
                        )
                        self._answered_at = self._clock()
                    elif op == "drain":
                        cut = self.driver.drain(StopReason(cmd["reason"]))
                        self.events.send(
                            {
                                "kind": "left",
                                "cmd": cmd["seq"],
                                "cut": serde.unstructure(cut),
                                "counters": self._counters(),
                            }
                        )
                        return cut
                    else:
                        raise IllegalTransitionError(f"unknown trainer command {op!r}")
                except Exception as exc:
                    self.events.send(
                        {
                            "kind": "failed",
                            "cmd": cmd.get("seq"),
                            "error": f"{type(exc).__name__}: {exc}",
                        }
                    )
                    raise
