"""Policy releases: the versions samplers load, committed through the store.

Layout (keys under the run's store)::

    releases/<release_id>/<files>          HF export or LoRA adapter, written first
    releases/<release_id>/manifest.json    the Release record, sha256 per file
    releases/LATEST.json                   the newest Release record, written last

``release_id`` is the policy version (``"7"``). Publishing a version again with the
same weight checksum is a no-op (nothing is written; ``LATEST.json`` is pointed at
it if it named another release, e.g. after a crash between manifest and pointer).
A rewound lineage (a trainer restored from an older cut publishes a version that
already exists with other weights) is a new release ``"<version>-r<k>"``: a
committed release is never overwritten, so a sampler reading one always gets the
files its manifest names.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Optional, Union

import attrs

from yeto_core import serde
from yeto_core.errors import ConfigError, NotFoundError, ReleaseError
from yeto_core.ports import ObjectStore
from yeto_core.records import Event, ShardDigest
from yeto_core.release.delta import (
    AUTO_MIN_BYTES,
    FORMAT,
    FULL_EVERY,
    MODES,
    DeltaCodec,
    DeltaError,
    apply_delta,
    build_delta,
)
from yeto_core.release.parent import DeltaParentKeeping
from yeto_core.release.shared import shared_with
from yeto_core.stores.manifest import (
    MANIFEST_NAME,
    digest_dir,
    download_verified,
    place_local,
    upload_files,
)
from yeto_core.stores.parallel import is_remote, map_all

_RELEASE_ID = re.compile(r"^(\d+)(?:-r(\d+))?$")


@attrs.frozen
class Release:
    """One committed policy release."""

    release_id: str
    version: int
    kind: str
    weight_checksum: str
    seq: int
    parent: Optional[str] = None
    created_at: float = 0.0
    files: tuple[ShardDigest, ...] = ()
    info: dict[str, Any] = attrs.field(factory=dict)
    #: ``"full"`` (``files`` are the export) or ``"delta"`` (``files`` rebuild it from
    #: ``delta["parent"]``; see :mod:`yeto_core.release.delta` and docs/releases.md)
    encoding: str = "full"
    #: the delta section (format, codec, parent, full, depth, per-file tensor entries)
    delta: Optional[dict[str, Any]] = None
    #: sha256 and size of every file of the full export (a delta's result must match)
    result_files: tuple[ShardDigest, ...] = ()
    #: files of ``files`` stored under another release's directory: name -> that release
    #: id (a file equal to the previous release's is not stored again; see
    #: :func:`~yeto_core.release.shared.shared_with`)
    shared: dict[str, str] = attrs.field(factory=dict)


def _id_key(release_id: str) -> tuple[int, int]:
    m = _RELEASE_ID.match(release_id)
    if not m:
        return (-1, -1)
    return int(m.group(1)), int(m.group(2) or 0)


class _PublisherView:
    """What a publisher knows of the committed release ids (found once, then its own):
    the ids, the ids of each version, and the highest seq."""

    def __init__(self, max_seq: int = 0) -> None:
        self.ids: set[str] = set()
        self.by_version: dict[int, list[str]] = {}
        self.max_seq = int(max_seq)

    def add(self, release_id: str, seq: int = 0) -> None:
        """Know ``release_id`` (published with ``seq``, when this publisher wrote it)."""
        if release_id not in self.ids:
            self.ids.add(release_id)
            self.by_version.setdefault(_id_key(release_id)[0], []).append(release_id)
        self.max_seq = max(self.max_seq, int(seq))


class ReleaseStore(DeltaParentKeeping):
    """Publish, find and fetch policy releases.

    A policy follower reads it as a
    :class:`~yeto_core.sampler.interfaces.FollowedReleases` (``store``, ``prefix``,
    ``last_fetch``, :meth:`latest`, :meth:`fetch`).

    :param store: the run's object store.
    :param prefix: key prefix (``releases``).
    :param emit: called with an :class:`~yeto_core.records.Event` per publication.
    :param clock: seconds since the epoch.
    :param codec: the release codec (``Plugins.release_codec()``); without one every
        release is published full and a delta release cannot be fetched.
    :param deltas: ``"auto"`` (a delta when the export's weights are at least
        ``delta_min_bytes``), ``"on"`` or ``"off"`` (publishing side).
    :param full_every: a full release at least every this many releases (bounds a chain).
    :param share_files: leave out of a publication the files equal to the previous
        release's (:mod:`~yeto_core.release.shared`); None: on a remote store only.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        prefix: str = "releases",
        emit: Optional[Callable[[Event], None]] = None,
        clock: Callable[[], float] = time.time,
        codec: Optional[DeltaCodec] = None,
        deltas: str = "off",
        full_every: int = FULL_EVERY,
        delta_min_bytes: int = AUTO_MIN_BYTES,
        share_files: Optional[bool] = None,
    ) -> None:
        self.store = store
        self.share_files = is_remote(store) if share_files is None else bool(share_files)
        self.prefix = prefix.rstrip("/")
        self._emit = emit or (lambda e: None)
        self._clock = clock
        if deltas not in MODES:
            raise ConfigError(
                f"releases.deltas = {deltas!r}: allowed values are {', '.join(MODES)}"
            )
        if int(full_every) < 1:
            raise ConfigError(f"releases.full_every = {full_every!r}: must be >= 1")
        self.codec = codec
        self.deltas = deltas
        self.full_every = int(full_every)
        self.delta_min_bytes = int(delta_min_bytes)
        #: the last export this store published (publishing side): the next delta's parent
        self._parent: Optional[tuple[Release, Path]] = None
        #: (name, size, mtime_ns, inode) of every kept file when it was kept
        self._parent_stat: list[tuple[str, int, int, int]] = []
        #: what the last :meth:`fetch` did (encoding, chain, bytes downloaded)
        self.last_fetch: dict[str, Any] = {}
        #: release id -> its files, for the last few full releases this store fetched
        #: (reading side: a later fetch links the unchanged ones from that local copy)
        self._verified: dict[str, tuple[ShardDigest, ...]] = {}
        # the last pointer or manifest bytes parsed, and their release: the pointer holds
        # the manifest's bytes, so a follower's polls and its fetch's manifest read parse
        # them once
        self._parsed: Optional[tuple[bytes, Release]] = None
        #: what the last :meth:`publish` stored (encoding, bytes, why it was full)
        self.last_publish: dict[str, Any] = {}
        #: this publisher's view of the releases it scanned and wrote
        self._view: Optional[_PublisherView] = None

    @property
    def pointer_key(self) -> str:
        return f"{self.prefix}/LATEST.json"

    def _dir(self, release_id: str) -> str:
        return f"{self.prefix}/{release_id}"

    def _ids(self) -> list[str]:
        names = set()
        for key in self.store.list(f"{self.prefix}/"):
            rest = key[len(self.prefix) + 1 :]
            if "/" in rest and _RELEASE_ID.match(rest.split("/", 1)[0]):
                names.add(rest.split("/", 1)[0])
        return sorted(names, key=_id_key)

    def _read(self, release_id: str) -> Optional[Release]:
        key = f"{self._dir(release_id)}/{MANIFEST_NAME}"
        try:
            raw = self.store.get(key)
        except NotFoundError:
            return None
        try:
            rel = self._parse(raw, "release manifest", key)
        except ConfigError as exc:
            raise ReleaseError(str(exc)) from None
        if rel.release_id != release_id:
            raise ReleaseError(f"{key} names release {rel.release_id!r}, not {release_id!r}")
        return rel

    # -- reading ------------------------------------------------------------------------

    def latest(self) -> Optional[Release]:
        """The release ``LATEST.json`` names, or None before the first publication."""
        try:
            raw = self.store.get(self.pointer_key)
        except NotFoundError:
            return None
        return self._pointer_release(raw)

    def _pointer_release(self, raw: bytes) -> Release:
        try:
            return self._parse(raw, "release pointer", self.pointer_key)
        except ConfigError as exc:
            raise ReleaseError(f"{exc}\n  Republish a release to repair the pointer.") from None

    def _parse(self, raw: bytes, what: str, root: str) -> Release:
        """``serde.loads(raw, Release)``, or the release of the same bytes parsed last."""
        parsed = self._parsed
        if parsed is not None and parsed[0] == raw:
            return parsed[1]
        rel = serde.loads(raw, Release, what=what, root=root)
        self._parsed = (bytes(raw), rel)
        return rel

    def list(self) -> list[Release]:
        """Every committed release, in publication order (``seq``)."""
        return self._read_all(self._ids())

    def _read_all(self, ids: list[str]) -> list[Release]:
        """The committed releases of ``ids`` (manifests read at once on a remote store),
        in publication order."""
        out = [r for r in map_all(self.store, self._read, ids) if r is not None]
        return sorted(out, key=lambda r: r.seq)

    def get(self, ref: Union[Release, str, int]) -> Release:
        """Resolve a release, a release id, or a version (its newest release)."""
        if isinstance(ref, Release):
            ref = ref.release_id
        if isinstance(ref, int):
            same = [r for r in self.list() if r.version == ref]
            if not same:
                raise ReleaseError(f"no release of version {ref} under {self.prefix}/")
            return same[-1]
        rel = self._read(ref)
        if rel is None:
            raise ReleaseError(f"release {ref!r} has no {MANIFEST_NAME} under {self.prefix}/")
        return rel

    def fetch(
        self,
        ref: Union[Release, str, int],
        dest_dir: str | os.PathLike[str],
        *,
        have: Optional[tuple[str, str | os.PathLike[str]]] = None,
    ) -> Path:
        """Download a release into ``dest_dir`` and verify every file against its manifest.

        A full release's files that ``have`` (``(release_id, local_dir)``, the copy a
        follower serves, fetched full by this store) holds with the same sha256 and size
        are linked from there instead of downloaded. A delta release is rebuilt: from
        ``have`` when the delta chain reaches it, else from the nearest full
        release and every delta after it. Every step checks the parent's and the result's
        checksum per tensor and the result's files against the full export's digests.

        :raises ReleaseError: a file is missing or its sha256 or size does not match
            (a :class:`~yeto_core.release.delta.DeltaError`, with a ``reason``, when a
            delta does not apply).
        :returns: ``dest_dir``.

        A :class:`Release` is fetched as it is (a follower's, read from ``LATEST.json``,
        which holds the bytes of the manifest: read again, it would be a request for
        what the pointer said); an id or a version is resolved through its manifest.
        """
        rel = ref if isinstance(ref, Release) else self.get(ref)
        dest = Path(dest_dir)
        if rel.encoding != "delta":
            reused = self._download(rel, dest, self._reusable(rel, have))
            self._verified[rel.release_id] = rel.files
            if len(self._verified) > 4:  # the oldest goes
                del self._verified[next(iter(self._verified))]
            self.last_fetch = {
                "encoding": "full",
                "chain": [rel.release_id],
                "bytes": _size(rel) - sum(f.size for f in rel.files if f.name in reused),
                "reused_files": len(reused),
            }
            return dest
        if have is None:
            return self._fetch_chain(rel, dest, None)
        try:
            return self._fetch_chain(rel, dest, have)
        except DeltaError as exc:
            if exc.reason != "parent_mismatch":
                raise
            # the local copy is not the release it names (a damaged disk, a rewound
            # lineage): rebuild from the nearest full release; a delta made against
            # another parent fails there too and is refused
            self._fetch_chain(rel, dest, None)
            self.last_fetch["local_copy_refused"] = str(exc)
            return dest

    def _fetch_chain(
        self, rel: Release, dest: Path, have: Optional[tuple[str, str | os.PathLike[str]]]
    ) -> Path:
        chain = [rel]
        start: Optional[Path] = None
        while chain[-1].encoding == "delta":
            parent_id = str((chain[-1].delta or {}).get("parent"))
            if have is not None and parent_id == have[0]:
                start = Path(have[1])
                break
            parent = self._read(parent_id)
            if parent is None:
                raise DeltaError(
                    "chain_broken",
                    f"delta release {chain[-1].release_id!r} names parent {parent_id!r}, which "
                    f"has no {MANIFEST_NAME} under {self.prefix}/; republish a full release",
                )
            chain.append(parent)
        chain.reverse()
        steps = chain if start is not None else chain[1:]
        fetched = 0
        scratch = dest.parent / f".{dest.name}.steps"
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            if start is None:
                start = scratch / chain[0].release_id
                self._download(chain[0], start)
                fetched += _size(chain[0])
            for i, step in enumerate(steps):
                payload = scratch / f"{step.release_id}.delta"
                self._download(step, payload)
                fetched += _size(step)
                out = dest if i == len(steps) - 1 else scratch / step.release_id
                if out.exists():
                    shutil.rmtree(out)
                apply_delta(
                    self.codec,
                    step.delta or {},
                    step.result_files,
                    start,
                    payload,
                    out,
                    release_id=step.release_id,
                )
                start = out
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        self.last_fetch = {
            "encoding": "delta",
            "chain": [r.release_id for r in chain],
            "from": have[0] if steps is chain else chain[0].release_id,
            "bytes": fetched,
        }
        return dest

    def _reusable(
        self, rel: Release, have: Optional[tuple[str, str | os.PathLike[str]]]
    ) -> dict[str, Path]:
        """Files of ``rel`` the local copy ``have`` already holds: fetched by this store
        (a full release) and verified then against the same sha256 and size."""
        if have is None or have[0] not in self._verified:
            return {}
        before = {(f.name, f.sha256, f.size) for f in self._verified[have[0]]}
        return {
            f.name: Path(have[1]) / f.name
            for f in rel.files
            if (f.name, f.sha256, f.size) in before
        }

    def _download(
        self, rel: Release, dest: Path, reuse: Optional[dict[str, Path]] = None
    ) -> set[str]:
        """Fetch ``rel``'s files into ``dest``: those in ``reuse`` placed from there (while
        their size holds), the others downloaded and verified. :returns: the names placed."""
        dest.mkdir(parents=True, exist_ok=True)
        reuse = reuse or {}
        placed = {
            f.name
            for f in rel.files
            if f.name in reuse and place_local(reuse[f.name], dest / f.name, f.size)
        }
        problems = download_verified(
            self.store,
            self._dir(rel.release_id),
            [f for f in rel.files if f.name not in placed],
            dest,
            prefixes={name: self._dir(holder) for name, holder in rel.shared.items()},
        )
        if problems:
            raise ReleaseError(
                f"release {rel.release_id!r} (version {rel.version}) fails its digest check: "
                + "; ".join(problems)
                + ". Do not load it; keep serving the previous release."
            )
        return placed

    # -- writing ------------------------------------------------------------------------

    def publish(
        self,
        local_dir: str | os.PathLike[str],
        info: Mapping[str, Any],
        *,
        handoff: bool = False,
        ready: Optional[Callable[[], None]] = None,
    ) -> Release:
        """Commit the files of ``local_dir`` as a release.

        :param info: ``version`` (int), ``kind`` and ``weight_checksum`` (what the backend's
            ``publish_release`` returned plus the driver's version); other keys go to
            ``Release.info``.
        :param ready: called after the files are stored and before the manifest and the
            pointer make the release visible (the trainer waits there for the commit of
            the round the release was trained on); its error stops the publication.
        :param handoff: the caller never changes ``local_dir``'s files again (the driver's
            scratch export): the store may keep the files themselves, not a copy (the
            ``dir`` store hard-links them, :meth:`~yeto_core.ports.ObjectStore.put_files`),
            unless this store keeps the export as the next delta's parent: the stored
            release and that working copy then never share a file.
        :returns: the committed release (the existing one for a republication).
        """
        missing = [k for k in ("version", "kind", "weight_checksum") if k not in info]
        if missing:
            raise ReleaseError(
                f"release info lacks {missing}; the backend's publish_release must return "
                "kind and weight_checksum, and the driver adds version"
            )
        version = int(info["version"])
        checksum = str(info["weight_checksum"])
        extra = {k: v for k, v in info.items() if k not in ("version", "kind", "weight_checksum")}
        latest, pointer_version = self._latest_versioned()
        view = self._publisher_view(latest)
        same_version = view.by_version.get(version, [])
        for rid in same_version:
            existing = self._read(rid)
            if existing is not None and existing.weight_checksum == checksum:
                if latest is None or latest.release_id != existing.release_id:
                    if ready is not None:
                        ready()
                    self._swap_pointer(existing, pointer_version)
                self._keep_parent(local_dir, existing)
                self.last_publish = {  # nothing stored: not the previous publication's figures
                    "encoding": existing.encoding,
                    "stored_bytes": 0,
                    "full_bytes": sum(f.size for f in (existing.result_files or existing.files)),
                    "republished": True,
                }
                self._event("release_republished", existing)
                return existing
        committed = [
            i for i in same_version if self.store.exists(f"{self._dir(i)}/{MANIFEST_NAME}")
        ]
        if not committed:
            release_id = str(version)
        else:
            release_id = f"{version}-r{max(_id_key(i)[1] for i in committed) + 1}"
        files = digest_dir(local_dir)
        seq = max(latest.seq if latest else 0, view.max_seq) + 1
        upload_dir, encoding, delta, why = (
            Path(local_dir),
            "full",
            None,
            self._full_reason(local_dir, latest),
        )
        dfiles = files
        if why is None:
            assert self._parent is not None and self.codec is not None
            prel, pdir = self._parent
            ddir = Path(local_dir).with_name(Path(local_dir).name + ".delta")
            shutil.rmtree(ddir, ignore_errors=True)
            tensor_files = build_delta(self.codec, pdir, Path(local_dir), ddir)
            dfiles = digest_dir(ddir)  # what is uploaded (digested once)
            if sum(f.size for f in dfiles) < sum(f.size for f in files):
                pdelta = prel.delta or {}
                delta = {
                    "format": FORMAT,
                    "codec": self.codec.NAME,
                    "parent": prel.release_id,
                    "parent_weight_checksum": prel.weight_checksum,
                    "full": pdelta.get("full", prel.release_id),
                    "depth": int(pdelta.get("depth", 0)) + 1,
                    "files": tensor_files,
                }
                upload_dir, encoding = ddir, "delta"
            else:
                why = "the delta is not smaller than the full export"
                shutil.rmtree(ddir, ignore_errors=True)
        stored = dfiles if encoding == "delta" else files
        shared = shared_with(stored, latest) if self.share_files else {}
        rel = Release(
            release_id=release_id,
            version=version,
            kind=str(info["kind"]),
            weight_checksum=checksum,
            seq=seq,
            parent=latest.release_id if latest else None,
            created_at=self._clock(),
            files=stored,
            info=extra,
            encoding=encoding,
            delta=delta,
            result_files=files,
            shared=shared,
        )
        # a delta's files are this store's own scratch: always handed over
        upload_files(
            self.store,
            self._dir(release_id),
            upload_dir,
            [f for f in stored if f.name not in shared],
            handoff=encoding == "delta" or (handoff and not self._keeps_parent(local_dir)),
        )
        if upload_dir != Path(local_dir):
            shutil.rmtree(upload_dir, ignore_errors=True)
        if ready is not None:
            ready()
        manifest_key = f"{self._dir(release_id)}/{MANIFEST_NAME}"
        if not self.store.put_if_absent(manifest_key, serde.dumps(rel).encode()):
            raise ReleaseError(
                f"{manifest_key} was committed by another publisher at the same time; only one "
                "trainer incarnation may publish per store"
            )
        self._swap_pointer(rel, pointer_version)
        view.add(release_id, seq)
        self._keep_parent(local_dir, rel)
        self.last_publish = {
            "encoding": encoding,
            "stored_bytes": sum(f.size for f in stored if f.name not in shared),
            "shared_files": len(shared),
            "full_bytes": sum(f.size for f in files),
            **({"full_because": why} if encoding == "full" and self.deltas != "off" else {}),
        }
        self._event("release_published", rel, **self.last_publish)
        return rel

    def _publisher_view(self, latest: Optional[Release]) -> _PublisherView:
        """The release ids and highest seq the next publication builds on.

        The first publication of this object lists the prefix and reads every manifest
        (O(releases)); later ones reuse what it saw plus what it wrote since, so a
        publication costs O(1) requests and O(1) work instead of O(history). The view is
        thrown away and rebuilt whenever the pointer names a release it does not know or
        a higher seq (someone else published).
        """
        view = self._view
        if view is not None and (
            latest is None or (latest.release_id in view.ids and latest.seq <= view.max_seq)
        ):
            return view
        ids = self._ids()
        view = _PublisherView(max_seq=max([r.seq for r in self._read_all(ids)] or [0]))
        for rid in ids:
            view.add(rid)
        self._view = view
        return view

    def _latest_versioned(self) -> tuple[Optional[Release], Optional[str]]:
        """The pointer's release and its version, from one read."""
        try:
            raw, version = self.store.get_versioned(self.pointer_key)
        except NotFoundError:
            return None, None
        return self._pointer_release(raw), version

    def _swap_pointer(self, rel: Release, version: Optional[str]) -> None:
        """Point ``LATEST.json`` at ``rel`` if it still holds what this publisher read."""
        if self.store.put_if_match(self.pointer_key, serde.dumps(rel).encode(), version) is None:
            raise ReleaseError(
                f"{self.pointer_key} changed while release {rel.release_id} was published: "
                "another publisher moved it (only one trainer incarnation may publish per store; "
                "a head fenced by a newer one must stop). The pointer was left as that one wrote it"
            )

    def _event(self, kind: str, rel: Release, **extra: Any) -> None:
        self._emit(
            Event(
                kind=kind,
                time=self._clock(),
                source="releases",
                data={
                    "release_id": rel.release_id,
                    "version": rel.version,
                    "weight_checksum": rel.weight_checksum,
                    "seq": rel.seq,
                    **extra,
                },
            )
        )


def _size(rel: Release) -> int:
    return sum(f.size for f in rel.files)
