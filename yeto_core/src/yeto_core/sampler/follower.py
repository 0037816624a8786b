"""The PolicyFollower: keeps a sampler engine on the newest verified policy release.

It watches ``releases/LATEST.json`` (through :meth:`ReleaseStore.latest`),
fetches a new release into a local directory (every file verified against its
manifest; a mismatch raises :class:`~yeto_core.errors.ReleaseError`), loads it
into the engine under the **update lock**, stamps the version, and reads the
engine's served checksum back. A digest or checksum mismatch is **refused**:
an event, the refusal counted, and the engine keeps serving the previous
version (rolled back if the bad weights had been installed).

A **delta release** (``encoding == "delta"``, :mod:`yeto_core.release.delta`) is
rebuilt in the fetch step on the local copy of the release served now: the
store applies the chain of deltas from it (or, when the follower missed a
parent, from the nearest full release), checks the parent's and the result's
checksum per tensor and every rebuilt file's sha256 against the full export's.
A delta that fails is refused like a bad digest (reason ``parent_mismatch``,
``tensor_checksum_mismatch``, ``result_digest_mismatch``, ``chain_broken`` or
``no_codec``) and the previous release keeps serving. ``release_loaded`` says
``encoding``, ``chain``, ``from`` (a delta's: the local copy's release id, or the
full release it was rebuilt from, ``chain[0]``), ``fetched_bytes`` and ``fetch_s``.

The sampler holds the weights for the length of a round
(``with follower.round(): ...``). A release is fetched and checked before the weights are
asked for, so a round waits only for the engine's load and its checks, never for the
store. A load that finds a round in progress waits
for it (a **deferral**), but never longer than ``reload_max_defer_s`` (``[[samplers]]``,
default 600 s) from the moment the release was first seen; then the load is **forced**
while the round runs (a streaming round that holds the weights while its trials run),
and ``release_loaded`` says ``forced`` and ``deferred_s`` (how long a round held the
load back). A round entered with :meth:`PolicyFollower.generating` is never forced:
the load waits for its end however long it takes (one ``release_deferred`` with reason
``generating`` says the budget was spent). A round of ``on_release = "drop"``
(:meth:`PolicyFollower.release_round`) is forced at once, and one of ``"continue"``
lets a waiting load in between two decode steps (:meth:`PolicyFollower.pause_for_load`).
While a load waits, no new round starts. Counters: ``loads``, ``deferrals``,
``forced_loads``, ``refusals``, ``paused_loads``. A round that runs many trials (a
streaming round) knows a trial spanned a forced load when :attr:`version` at its end
differs from the version at its start: such a trial is dropped as
``served_by_other_version``, as the sampler loop drops a call a forced load landed in.

After the checksum, the **policy fingerprint** (:mod:`yeto_core.sampler.fingerprint`):
when the release carries one (``info["fingerprint"]``, recorded by the trainer)
the follower asks the engine for the log-probs of the same probes
(``engine.prompt_logprobs(probes)``) and compares them within the tolerance of
the release's dtype. A deviation over it refuses the release (reason
``fingerprint_mismatch``, with ``max_abs_dev``, ``tolerance`` and where) and puts
the previous release back. ``release_loaded`` says ``verified: true`` with the
deviation, or ``fingerprint: "unsupported"`` (the engine cannot score prompts)
or ``"absent"`` (the release has none). Counters: ``verified``, ``unverified``.

What the loop reads of a follower is :class:`~yeto_core.sampler.interfaces.Follower`
(the base class of every follower: :class:`PolicyFollower`, and the test doubles of
:mod:`yeto_core.testing`); what a follower reads of its release store is
:class:`~yeto_core.sampler.interfaces.FollowedReleases` (a
:class:`~yeto_core.release.store.ReleaseStore` is one).

Engine contract used here: ``load_release(local)`` with a :class:`LocalRelease`
(``version``, ``path``, ...), ``served_checksum()`` (None: the engine cannot read
its weights back; the fingerprint is then the only proof of what it serves),
optionally ``prompt_logprobs(probes)`` and ``rollback()`` (serve the weights
from before the last load again); without ``rollback`` the previous release is
loaded again (or, before any, ``engine.restore_base()`` when it has one).
"""

from __future__ import annotations

import collections
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import attrs

from yeto_core.errors import ReleaseError
from yeto_core.records import Event, LocalRelease
from yeto_core.sampler import fingerprint as fp
from yeto_core.sampler.hold import WeightsHold
from yeto_core.sampler.interfaces import FollowedReleases, Follower
from yeto_core.stage_profile import stage


@attrs.define
class FollowerCounters:
    loads: int = 0
    deferrals: int = 0
    forced_loads: int = 0
    refusals: int = 0
    #: rounds a forced load landed in: their samples mixed two policies (thrown away)
    straddled_rounds: int = 0
    verified: int = 0
    unverified: int = 0
    #: loads let in by a round paused between two decode steps (``on_release = "continue"``)
    paused_loads: int = 0


#: the default ``reload_max_defer_s`` (seconds a round may hold a ready release back)
DEFAULT_RELOAD_MAX_DEFER_S = 600.0
#: A paced follower (:meth:`PolicyFollower.start` with ``paced``) does not poll for this
#: share of the shortest of the last gaps between two new releases after it saw one
#: (the trainer publishes at its round's pace: on a remote store each poll is a request)
QUIET_SHARE = 0.8
#: ... and for at most this many seconds
QUIET_MAX_S = 5.0
#: Past the quiet share the next release is due: a paced follower polls every this share
#: of that gap (at least ``CATCH_MIN_S``, at most its ``poll_s``), so a release at the pace
#: is seen within a tenth of a round, not within ``poll_s`` (0.2 s, most of a round on a
#: remote store) ...
CATCH_SHARE = 0.1
CATCH_MIN_S = 0.01
#: ... until this many gaps have passed since the last new release (a trainer that
#: stopped or slowed down: ``poll_s`` again)
CATCH_GAPS = 2.0
#: the new releases' sightings the pace is taken from (their gaps: one fewer)
PACE_SIGHTINGS = 4


class PolicyFollower(WeightsHold, Follower):
    """Follow the newest release of ``releases`` with ``engine``.

    :param releases: a :class:`~yeto_core.release.store.ReleaseStore`
        (:class:`~yeto_core.sampler.interfaces.FollowedReleases`).
    :param engine: a :class:`~yeto_core.ports.SamplerEngine`.
    :param work_dir: where releases are fetched (the current and previous are kept).
    :param reload_max_defer_s: the longest a round in progress may delay a load.
    :param initial_version: the version the engine serves before the first load (the base: 0).
    :param clock: seconds (monotonic) for the deferral budget and event times (a test's
        clock: call :meth:`wake` after moving it, so a deferred load looks at it again).
    :param emit: called with every :class:`~yeto_core.records.Event`.
    :param source: the event source (the sampler island's name).
    """

    def __init__(
        self,
        releases: FollowedReleases,
        engine: Any,
        *,
        work_dir: str | Path,
        reload_max_defer_s: float = DEFAULT_RELOAD_MAX_DEFER_S,
        initial_version: int = 0,
        clock: Callable[[], float] = time.monotonic,
        emit: Optional[Callable[[Event], None]] = None,
        source: str = "sampler",
        fingerprint_tolerance: Optional[dict[str, float]] = None,
    ) -> None:
        if reload_max_defer_s < 0:
            raise ValueError(f"reload_max_defer_s={reload_max_defer_s}: must be >= 0 seconds")
        self.releases = releases
        self.engine = engine
        self.work_dir = Path(work_dir)
        self.reload_max_defer_s = float(reload_max_defer_s)
        self.clock = clock
        self._emit = emit or (lambda e: None)
        self.source = source
        self.counters = FollowerCounters()
        self.fingerprint_tolerance = dict(fingerprint_tolerance or {})
        #: the fingerprint check of the release served now (None: none was made)
        self.last_check: Optional[fp.Check] = None
        #: seconds the last load spent on its fingerprint check
        self.last_fingerprint_s = 0.0
        self.version = int(initial_version)
        #: clock times of the last two loads (a sampler estimates when the next comes)
        self.load_times: collections.deque[float] = collections.deque(maxlen=2)
        #: clock times this follower first saw each of the last new releases
        self.seen_times: collections.deque[float] = collections.deque(maxlen=PACE_SIGHTINGS)
        self.release_id: Optional[str] = None
        self.served_checksum = engine.served_checksum()
        self._current: Optional[LocalRelease] = None
        self._refused: set[str] = set()
        self._pending: Optional[tuple[str, float]] = None  # (release_id, first seen)
        self._deferred_ids: set[str] = set()
        self._init_hold()
        self._load_mutex = threading.Lock()  # one load at a time
        #: notified whenever the served version changes (:meth:`wait_version`)
        self._version_changed = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()

    # -- the sampler side -----------------------------------------------------------

    @property
    def forced_loads(self) -> int:  # type: ignore[override]
        """Loads forced into a round (``counters.forced_loads``)."""
        return self.counters.forced_loads

    # -- following ------------------------------------------------------------------

    def poll(self) -> Optional[str]:
        """Look at ``LATEST.json`` once and load a new release if there is one.

        Blocks while a round holds the weights, at most until the release's
        deferral budget is spent (a :meth:`generating` round: until it ends).
        :returns: ``"loaded"``, ``"forced"``, ``"refused"`` or None (nothing new).
        """
        with self._load_mutex:
            with stage("follower.latest"):
                rel = self.releases.latest()
            if rel is None or rel.release_id == self.release_id or rel.release_id in self._refused:
                return None
            now = self.clock()
            if self._pending is None or self._pending[0] != rel.release_id:
                self._pending = (rel.release_id, now)
                self.seen_times.append(now)
            first_seen = self._pending[1]
            # fetched and checked before the update lock: a round waits only for the load
            dest = self.work_dir / rel.release_id
            if dest.exists():
                shutil.rmtree(dest)
            try:
                with stage("follower.fetch_verify"):
                    fetched = self._fetch(rel, dest)
            except ReleaseError as exc:
                self._pending = None
                shutil.rmtree(dest, ignore_errors=True)
                return self._refuse(rel, exc.reason, str(exc))
            forced, deferred = self._take_weights(rel, first_seen)
            try:
                return self._load(
                    rel,
                    fetched,
                    forced=forced,
                    waited=self.clock() - first_seen,
                    deferred=deferred,
                )
            finally:
                with self._state:
                    self._loading = False
                    self._state.notify_all()

    def _load(
        self,
        rel: Any,
        fetched: dict[str, Any],
        *,
        forced: bool,
        waited: float,
        deferred: float = 0.0,
    ) -> str:
        """Load ``rel`` (fetched and checked into the work dir) with the weights taken."""
        self._pending = None
        self._deferred_ids.discard(rel.release_id)
        dest = self.work_dir / rel.release_id
        local = LocalRelease(
            version=int(rel.version),
            release_id=rel.release_id,
            path=str(dest),
            kind=rel.kind,
            weight_checksum=rel.weight_checksum,
            info=dict(rel.info or {}),
        )
        t_load = time.monotonic()
        try:
            with stage("follower.load"):
                self.engine.load_release(local)
        except Exception as exc:  # the engine refused the files: it keeps its weights
            shutil.rmtree(dest, ignore_errors=True)
            return self._refuse(rel, "engine_refused", f"{type(exc).__name__}: {exc}")
        served = self.engine.served_checksum()
        if served is not None and served != rel.weight_checksum:
            self._roll_back()
            shutil.rmtree(dest, ignore_errors=True)
            return self._refuse(
                rel,
                "checksum_mismatch",
                f"engine serves {served} after loading, the release says {rel.weight_checksum}",
            )
        load_s = time.monotonic() - t_load
        t_fp = time.monotonic()
        with stage("follower.fingerprint"):
            verdict, check = self.check_fingerprint(local)
        fingerprint_s = time.monotonic() - t_fp
        self.last_fingerprint_s = fingerprint_s
        if verdict == "mismatch":
            assert check is not None
            self._roll_back()
            shutil.rmtree(dest, ignore_errors=True)
            return self._refuse(
                rel,
                "fingerprint_mismatch",
                check.detail,
                max_abs_dev=check.max_abs_dev,
                tolerance=check.tolerance,
                probe=check.probe,
                position=check.position,
            )
        if verdict == "verified":
            self.counters.verified += 1
        else:
            self.counters.unverified += 1
        self.last_check = check
        proof: dict[str, Any] = {
            **fetched,
            "verified": verdict == "verified",
            "fingerprint": verdict,
            "load_s": round(load_s, 6),
            "fingerprint_s": round(fingerprint_s, 6),
        }
        if check is not None:
            proof["max_abs_dev"] = check.max_abs_dev
            proof["tolerance"] = check.tolerance
        previous = self._current
        with self._version_changed:
            self._current, self.version, self.release_id = local, local.version, rel.release_id
            self.load_times.append(self.clock())
            self._version_changed.notify_all()
        self.served_checksum = served
        self.counters.loads += 1
        if forced:
            self._event(
                "release_loaded",
                rel,
                forced=True,
                waited_s=waited,
                deferred_s=deferred,
                reason=f"round still in progress after reload_max_defer_s={self.reload_max_defer_s}",
                **proof,
            )
        else:
            self._event(
                "release_loaded", rel, forced=False, waited_s=waited, deferred_s=deferred, **proof
            )
        if previous is not None and previous.path != local.path:
            self._prune(keep={local.path, previous.path})
        return "forced" if forced else "loaded"

    def _fetch(self, rel: Any, dest: Path) -> dict[str, Any]:
        """Fetch ``rel`` into ``dest``: a delta release is rebuilt on the copy served now.

        :returns: what the fetch did, for the ``release_loaded`` event (``encoding``,
            ``chain``, ``fetched_bytes``, ``fetch_s``); empty for a store without deltas.
        """
        t0 = time.monotonic()
        # the copy served now: a delta applies to it; a full release links the files it
        # shares with it (config, tokenizer) instead of downloading them again
        have = None
        if self._current is not None and Path(self._current.path).is_dir():
            have = (self._current.release_id, self._current.path)
        self.releases.fetch(rel, dest, have=have)
        info = dict(self.releases.last_fetch or {})
        if not info:
            return {}
        return {
            "encoding": info.get("encoding", "full"),
            "chain": info.get("chain", []),
            **({"from": info["from"]} if "from" in info else {}),
            "fetched_bytes": info.get("bytes", 0),
            **({"reused_files": info["reused_files"]} if info.get("reused_files") else {}),
            "fetch_s": round(time.monotonic() - t0, 6),
        }

    def check_fingerprint(self, local: LocalRelease) -> tuple[str, Optional[fp.Check]]:
        """Compare what the engine serves with ``local``'s fingerprint.

        :returns: ``("verified" | "mismatch", check)``, ``("unsupported", None)`` (the engine
            cannot score prompts) or ``("absent", None)`` (the release has no fingerprint).
        """
        raw = (local.info or {}).get(fp.INFO_KEY)
        if not raw:
            return "absent", None
        expected = fp.Fingerprint.from_json(raw)
        measured = self.engine.prompt_logprobs([list(p) for p in expected.probes])
        if measured is None:
            return "unsupported", None
        check = fp.compare(expected, measured, overrides=self.fingerprint_tolerance)
        return ("verified" if check.ok else "mismatch"), check

    def verify_served(self, why: str = "check") -> Optional[fp.Check]:
        """Check the fingerprint of the release served now (after an engine server restart).

        Emits ``release_verified`` or, on a mismatch, ``served_policy_mismatch`` (the engine
        no longer serves the policy it loaded; the sampler should stop). A load in progress
        checks its own release, so then nothing is done. :returns: the check (None: none made).
        """
        if not self._load_mutex.acquire(blocking=False):
            return None
        try:
            if self._current is None:
                return None
            verdict, check = self.check_fingerprint(self._current)
            kind = "served_policy_mismatch" if verdict == "mismatch" else "release_verified"
            self._emit(
                Event(
                    kind=kind,
                    time=self.clock(),
                    source=self.source,
                    data={
                        "release_id": self._current.release_id,
                        "version": self._current.version,
                        "why": why,
                        "fingerprint": verdict,
                        **(check.to_json() if check is not None else {}),
                    },
                )
            )
            return check
        finally:
            self._load_mutex.release()

    def _roll_back(self) -> None:
        if type(self.engine).implements("rollback"):
            self.engine.rollback()
        elif self._current is not None:
            self.engine.load_release(self._current)
        elif type(self.engine).implements("restore_base"):
            self.engine.restore_base()
        else:
            raise ReleaseError(
                "a release failed its checksum after loading, and the engine has no rollback() "
                "and no previous release to load again; restart the sampler"
            )
        back = self.engine.served_checksum()
        if back is not None and back != self.served_checksum:
            raise ReleaseError(
                f"after refusing a release the engine serves {back}, not the previous "
                f"{self.served_checksum}; restart the sampler"
            )

    def _refuse(self, rel: Any, reason: str, detail: str, **measured: Any) -> str:
        self._refused.add(rel.release_id)
        self.counters.refusals += 1
        self._event(
            "release_refused",
            rel,
            reason=reason,
            detail=detail,
            kept_version=self.version,
            **measured,
        )
        return "refused"

    def _prune(self, keep: set[str]) -> None:
        for child in self.work_dir.iterdir() if self.work_dir.exists() else ():
            if child.is_dir() and str(child) not in keep:
                shutil.rmtree(child, ignore_errors=True)

    def _event(self, kind: str, rel: Any, **data: Any) -> None:
        self._emit(
            Event(
                kind=kind,
                time=self.clock(),
                source=self.source,
                data={
                    "release_id": rel.release_id,
                    "version": int(rel.version),
                    "served_version": self.version,
                    **data,
                    "counters": attrs.asdict(self.counters),
                },
            )
        )

    def wait_version(self, version: int, timeout: float) -> bool:
        """Wait until the engine serves ``version`` or newer, at most ``timeout`` s."""
        with self._version_changed:
            return self._version_changed.wait_for(
                lambda: int(self.version) >= version, timeout=max(0.0, timeout)
            )

    # -- a watcher thread -----------------------------------------------------------

    def next_poll_s(self, poll_s: float) -> float:
        """Seconds from now to the next poll of a paced follower.

        Right after a new release was seen: until :data:`QUIET_SHARE` of the shortest gap
        between the last new releases has passed since (at most :data:`QUIET_MAX_S`; a
        release that comes sooner is seen that much later). Then the next one is due:
        every :data:`CATCH_SHARE` of that gap (between :data:`CATCH_MIN_S` and
        ``poll_s``), until :data:`CATCH_GAPS` gaps have passed; then, or with no pace yet
        (fewer than three sightings), every ``poll_s``."""
        times = list(self.seen_times)
        if len(times) < 3:  # two gaps at least: one is no pace
            return poll_s
        gap = min(b - a for a, b in zip(times[:-1], times[1:], strict=True))
        since = self.clock() - times[-1]
        quiet = min(QUIET_SHARE * gap, QUIET_MAX_S) - since
        if quiet >= CATCH_MIN_S:  # (a rounding error's quiet is none: no zero waits)
            return quiet
        if since < CATCH_GAPS * gap:
            return min(poll_s, max(CATCH_SHARE * gap, CATCH_MIN_S))
        return poll_s

    def start(self, poll_s: float = 1.0, *, paced: bool = False) -> None:
        """Poll in a daemon thread until :meth:`stop`: after each poll it waits ``poll_s``
        seconds, or less when the store's watch on the releases prefix wakes it first
        (a new ``LATEST.json``; :meth:`~yeto_core.ports.ObjectStore.watch`). ``paced``:
        after a new release it waits :meth:`next_poll_s` (the trainer's pace), not ``poll_s``.
        """
        if self._thread is not None:
            return
        self._stop.clear()
        store, prefix = self.releases.store, self.releases.prefix
        watch = store.watch(prefix) if store is not None and prefix else None

        def run() -> None:
            while not self._stop.is_set():
                try:
                    self.poll()
                except Exception as exc:  # keep following; the next poll retries
                    self._emit(
                        Event(
                            kind="follower_error",
                            time=self.clock(),
                            source=self.source,
                            data={"error": f"{type(exc).__name__}: {exc}"},
                        )
                    )
                wait = self.next_poll_s(poll_s) if paced else poll_s
                with stage("follower.wait_poll"):
                    # in steps of poll_s at most: a stop (or the watch) ends a long wait
                    until = time.monotonic() + wait
                    while not self._stop.is_set():
                        step = min(until - time.monotonic(), poll_s)
                        if step <= 0:
                            break
                        if watch is None:
                            self._stop.wait(step)
                        elif watch.wait(step):
                            break
            if watch is not None:
                watch.close()

        self._thread = threading.Thread(target=run, name="policy-follower", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
