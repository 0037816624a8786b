"""Consistent cuts: the trainer's whole state at a round boundary, committed through the store.

Layout (keys under the run's store)::

    cuts/<cut_id>/<shard files>     written first (the backend fills a local dir)
    cuts/<cut_id>/manifest.json     the ConsistentCut record with sha256 per shard
    cuts/LATEST                     the newest committed cut id, written last

``cut_id`` is ``c<seq:08d>-i<incarnation>-<trigger>``; ``seq`` grows by one per
cut, so key order is commit order. A cut whose manifest is missing or unreadable,
or with a shard whose digest does not match, is never restored: :meth:`CutStore.latest_valid`
walks back to the next older valid cut and emits a ``cut_invalid`` event saying why.
Retention keeps the newest ``keep`` committed cuts.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import attrs

from yeto_core import serde
from yeto_core.errors import ConfigError, CutError, NotFoundError
from yeto_core.ports import ObjectStore
from yeto_core.records import ConsistentCut, Event
from yeto_core.stores.manifest import (
    MANIFEST_NAME,
    delete_dir,
    digest_dir,
    download_verified,
    sha256_bytes,
    upload_files,
)

_CUT_ID = re.compile(r"^c(\d{8})-i(\d+)-([a-z]+)$")


def _seq(cut_id: str) -> int:
    m = _CUT_ID.match(cut_id)
    return int(m.group(1)) if m else -1


class CutStore:
    """Commit, list and restore consistent cuts in an object store.

    :param store: the run's object store.
    :param prefix: key prefix of the cuts (``cuts``).
    :param keep: how many committed cuts retention keeps (at least 1).
    :param emit: called with an :class:`~yeto_core.records.Event` for every cut that is
        committed, pruned or refused.
    :param clock: seconds since the epoch (injected for replayable tests).
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        prefix: str = "cuts",
        keep: int = 3,
        emit: Optional[Callable[[Event], None]] = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if keep < 1:
            raise ConfigError(f"cuts.keep must be at least 1, got {keep}")
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.keep = keep
        self._emit = emit or (lambda e: None)
        self._clock = clock

    # -- keys ---------------------------------------------------------------------------

    @property
    def pointer_key(self) -> str:
        return f"{self.prefix}/LATEST"

    def _dir(self, cut_id: str) -> str:
        return f"{self.prefix}/{cut_id}"

    def _cut_dirs(self) -> list[str]:
        """Every cut directory name present (committed or not), in commit order."""
        names = set()
        for key in self.store.list(f"{self.prefix}/"):
            rest = key[len(self.prefix) + 1 :]
            if "/" in rest and _CUT_ID.match(rest.split("/", 1)[0]):
                names.add(rest.split("/", 1)[0])
        return sorted(names, key=_seq)

    def _event(self, kind: str, **data: Any) -> None:
        self._emit(Event(kind=kind, time=self._clock(), source="cuts", data=data))

    # -- reading ------------------------------------------------------------------------

    def latest_id(self) -> Optional[str]:
        """The id ``cuts/LATEST`` names, or None when no cut was ever committed."""
        try:
            text = self.store.get(self.pointer_key).decode().strip()
        except NotFoundError:
            return None
        return text if _CUT_ID.match(text) else None

    def read_manifest(self, cut_id: str) -> ConsistentCut:
        """The record of ``cut_id``; raise :class:`CutError` when missing or invalid."""
        key = f"{self._dir(cut_id)}/{MANIFEST_NAME}"
        try:
            raw = self.store.get(key)
        except NotFoundError:
            raise CutError(
                f"cut {cut_id!r} has no {MANIFEST_NAME} ({key}); it was never committed"
            ) from None
        try:
            cut = serde.loads(raw, ConsistentCut, what="cut manifest", root=key)
        except ConfigError as exc:
            raise CutError(str(exc)) from None
        if cut.cut_id != cut_id:
            raise CutError(
                f"{key} names cut {cut.cut_id!r}, not {cut_id!r}; the manifest was copied"
            )
        return cut

    def list(self) -> list[ConsistentCut]:
        """Committed cuts with a readable manifest, oldest first (shards not verified)."""
        latest = self.latest_id()
        if latest is None:
            return []
        out = []
        for name in self._cut_dirs():
            if _seq(name) > _seq(latest):
                continue
            try:
                out.append(self.read_manifest(name))
            except CutError:
                continue
        return out

    def latest_valid(
        self, dest_dir: str | os.PathLike[str]
    ) -> Optional[tuple[ConsistentCut, Path]]:
        """Download the newest valid committed cut into ``dest_dir/<cut_id>``.

        Walks back from ``cuts/LATEST``: a cut with a bad manifest or a shard whose digest
        does not match is skipped with a ``cut_invalid`` event naming the problem.

        :returns: the cut and the local directory of its shards, or None when no valid
            cut exists (a fresh run).
        """
        latest = self.latest_id()
        if latest is None:
            return None
        dest_root = Path(dest_dir)
        candidates = [n for n in self._cut_dirs() if _seq(n) <= _seq(latest)]
        if latest not in candidates:
            self._event(
                "cut_invalid", cut_id=latest, problem="cuts/LATEST names a cut with no files"
            )
        for name in reversed(candidates):
            try:
                cut = self.read_manifest(name)
            except CutError as exc:
                self._event("cut_invalid", cut_id=name, problem=str(exc))
                continue
            local = dest_root / name
            if local.exists():
                shutil.rmtree(local)
            local.mkdir(parents=True)
            problems = download_verified(self.store, self._dir(name), cut.files, local)
            if problems:
                shutil.rmtree(local, ignore_errors=True)
                self._event("cut_invalid", cut_id=name, problem="; ".join(problems))
                continue
            if name != latest:
                self._event("cut_fallback", cut_id=name, latest=latest)
            return cut, local
        return None

    def verify(self, cut_id: str) -> list[str]:
        """What is wrong with committed cut ``cut_id`` (empty: its manifest reads and every
        shard matches its digest); nothing is written or kept on disk."""
        try:
            cut = self.read_manifest(cut_id)
        except CutError as exc:
            return [str(exc)]
        problems = []
        for f in cut.files:
            key = f"{self._dir(cut_id)}/{f.name}"
            try:
                data = self.store.get(key)
            except NotFoundError:
                problems.append(f"{key}: missing (the manifest lists it)")
                continue
            if len(data) != f.size or sha256_bytes(data) != f.sha256:
                problems.append(f"{key}: size or sha256 does not match the manifest")
        return problems

    # -- writing ------------------------------------------------------------------------

    def commit(self, local_dir: str | os.PathLike[str], record: ConsistentCut) -> ConsistentCut:
        """Commit the shards in ``local_dir`` as a new cut described by ``record``.

        Shards first, the manifest next, ``cuts/LATEST`` last, then retention.

        :returns: the committed record (with ``cut_id``, ``files`` and ``created_at``).
        """
        try:
            _, pointer_version = self.store.get_versioned(self.pointer_key)
        except NotFoundError:
            pointer_version = None
        files = digest_dir(local_dir)
        dirs = self._cut_dirs()
        seq = (_seq(dirs[-1]) + 1) if dirs else 1
        cut_id = f"c{seq:08d}-i{record.incarnation}-{record.trigger.value.lower()}"
        cut = attrs.evolve(record, cut_id=cut_id, files=files, created_at=self._clock())
        upload_files(self.store, self._dir(cut_id), local_dir, files)
        manifest_key = f"{self._dir(cut_id)}/{MANIFEST_NAME}"
        if not self.store.put_if_absent(manifest_key, serde.dumps(cut).encode()):
            raise CutError(
                f"{manifest_key} already exists: another trainer committed cut {cut_id} at the "
                "same time. Only one trainer incarnation may run per store; release the other."
            )
        if self.store.put_if_match(self.pointer_key, cut_id.encode(), pointer_version) is None:
            delete_dir(self.store, self._dir(cut_id))  # ours, never pointed at
            raise CutError(
                f"{self.pointer_key} changed while cut {cut_id} was committed: another trainer "
                "committed a cut meanwhile (only one trainer incarnation may run per store; a "
                f"head fenced by a newer one must stop). Cut {cut_id} was removed"
            )
        self._event(
            "cut_committed",
            cut_id=cut_id,
            trigger=cut.trigger.value,
            policy_version=cut.policy_version,
            trained_rounds=cut.trained_rounds,
            buffer_watermark=cut.buffer_watermark,
        )
        self._retain(cut_id)
        return cut

    def _retain(self, newest: str) -> None:
        committed, garbage = [], []
        for name in self._cut_dirs():
            if _seq(name) > _seq(newest):
                continue
            if self.store.exists(f"{self._dir(name)}/{MANIFEST_NAME}"):
                committed.append(name)
            elif name != newest:
                garbage.append(name)
        for name in committed[: -self.keep] + garbage:
            delete_dir(self.store, self._dir(name))
            self._event("cut_pruned", cut_id=name)
