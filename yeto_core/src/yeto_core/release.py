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
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Optional, Union

import attrs

from yeto_core import serde
from yeto_core.errors import ConfigError, NotFoundError, ReleaseError
from yeto_core.manifest import MANIFEST_NAME, digest_dir, download_verified, upload_files
from yeto_core.ports import ObjectStore
from yeto_core.records import Event, ShardDigest

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


def _id_key(release_id: str) -> tuple[int, int]:
    m = _RELEASE_ID.match(release_id)
    if not m:
        return (-1, -1)
    return int(m.group(1)), int(m.group(2) or 0)


class ReleaseStore:
    """Publish, find and fetch policy releases.

    :param store: the run's object store.
    :param prefix: key prefix (``releases``).
    :param emit: called with an :class:`~yeto_core.records.Event` per publication.
    :param clock: seconds since the epoch.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        prefix: str = "releases",
        emit: Optional[Callable[[Event], None]] = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/")
        self._emit = emit or (lambda e: None)
        self._clock = clock

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
            rel = serde.loads(raw, Release, what="release manifest", root=key)
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
        try:
            return serde.loads(raw, Release, what="release pointer", root=self.pointer_key)
        except ConfigError as exc:
            raise ReleaseError(f"{exc}\n  Republish a release to repair the pointer.") from None

    def list(self) -> list[Release]:
        """Every committed release, in publication order (``seq``)."""
        out = [r for r in (self._read(i) for i in self._ids()) if r is not None]
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

    def fetch(self, ref: Union[Release, str, int], dest_dir: str | os.PathLike[str]) -> Path:
        """Download a release into ``dest_dir`` and verify every file against its manifest.

        :raises ReleaseError: a file is missing or its sha256 or size does not match.
        :returns: ``dest_dir``.
        """
        rel = self.get(ref)
        dest = Path(dest_dir)
        dest.mkdir(parents=True, exist_ok=True)
        problems = download_verified(self.store, self._dir(rel.release_id), rel.files, dest)
        if problems:
            raise ReleaseError(
                f"release {rel.release_id!r} (version {rel.version}) fails its digest check: "
                + "; ".join(problems)
                + ". Do not load it; keep serving the previous release."
            )
        return dest

    # -- writing ------------------------------------------------------------------------

    def publish(self, local_dir: str | os.PathLike[str], info: Mapping[str, Any]) -> Release:
        """Commit the files of ``local_dir`` as a release.

        :param info: ``version`` (int), ``kind`` and ``weight_checksum`` (what the backend's
            ``publish_release`` returned plus the driver's version); other keys go to
            ``Release.info``.
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
        ids = self._ids()
        same_version = [i for i in ids if _id_key(i)[0] == version]
        for rid in same_version:
            existing = self._read(rid)
            if existing is not None and existing.weight_checksum == checksum:
                if latest is None or latest.release_id != existing.release_id:
                    self._swap_pointer(existing, pointer_version)
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
        seq = max([latest.seq if latest else 0] + [r.seq for r in self.list()[-1:]]) + 1
        rel = Release(
            release_id=release_id,
            version=version,
            kind=str(info["kind"]),
            weight_checksum=checksum,
            seq=seq,
            parent=latest.release_id if latest else None,
            created_at=self._clock(),
            files=files,
            info=extra,
        )
        upload_files(self.store, self._dir(release_id), local_dir, files)
        manifest_key = f"{self._dir(release_id)}/{MANIFEST_NAME}"
        if not self.store.put_if_absent(manifest_key, serde.dumps(rel).encode()):
            raise ReleaseError(
                f"{manifest_key} was committed by another publisher at the same time; only one "
                "trainer incarnation may publish per store"
            )
        self._swap_pointer(rel, pointer_version)
        self._event("release_published", rel)
        return rel

    def _latest_versioned(self) -> tuple[Optional[Release], Optional[str]]:
        try:
            _, version = self.store.get_versioned(self.pointer_key)
        except NotFoundError:
            return None, None
        return self.latest(), version

    def _swap_pointer(self, rel: Release, version: Optional[str]) -> None:
        """Point ``LATEST.json`` at ``rel`` if it still holds what this publisher read."""
        if self.store.put_if_match(self.pointer_key, serde.dumps(rel).encode(), version) is None:
            raise ReleaseError(
                f"{self.pointer_key} changed while release {rel.release_id} was published: "
                "another publisher moved it (only one trainer incarnation may publish per store; "
                "a head fenced by a newer one must stop). The pointer was left as that one wrote it"
            )

    def _event(self, kind: str, rel: Release) -> None:
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
                },
            )
        )
