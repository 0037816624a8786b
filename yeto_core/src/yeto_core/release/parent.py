"""The trainer's kept copy of its last export, the parent of its next delta release:
:class:`DeltaParentKeeping`, a mixin of :class:`~yeto_core.release.store.ReleaseStore`.

Why a publication is full rather than a delta (``_full_reason``), and keeping the export
just published (hard links where the file system allows, else a copy) with what each
kept file looked like, so a kept copy that changed since is never a delta's parent
(``_keep_parent``; docs/releases.md, "Costs and limits").
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Optional

from yeto_core.release.delta import weights_bytes
from yeto_core.stores.manifest import link_or_copy


class DeltaParentKeeping:
    """The host (``ReleaseStore``) holds ``deltas``, ``codec``, ``delta_min_bytes``,
    ``full_every``, ``_parent`` (``(release, kept dir)`` or None) and ``_parent_stat``."""

    def _full_reason(
        self, local_dir: str | os.PathLike[str], latest: Optional[Any]
    ) -> Optional[str]:
        """Why this publication is full (None: it can be a delta against the kept parent)."""
        if self.deltas == "off":
            return "deltas are off"
        if self.codec is None:
            return "no release codec is installed"
        if self.deltas == "auto":
            size = weights_bytes(local_dir)
            if size < self.delta_min_bytes:
                return f"weights are {size} bytes, under delta_min_bytes={self.delta_min_bytes}"
        if self._parent is None:
            return "no local copy of the previous release (first publication of this trainer)"
        prel = self._parent[0]
        if _stat_dir(self._parent[1]) != self._parent_stat:
            return (
                f"the kept copy of the previous export ({self._parent[1]}) changed since it was "
                "published (was the export rewritten in place?)"
            )
        if latest is None or latest.release_id != prel.release_id:
            return (
                f"LATEST is {latest.release_id if latest else None!r}, not this trainer's "
                f"previous release {prel.release_id!r}"
            )
        if int((prel.delta or {}).get("depth", 0)) + 1 >= self.full_every:
            return f"full_every={self.full_every}: the chain since the last full release is full"
        return None

    def _keeps_parent(self, local_dir: str | os.PathLike[str]) -> bool:
        """Whether :meth:`_keep_parent` keeps a copy of the export in ``local_dir``."""
        if self.deltas == "off" or self.codec is None:
            return False
        # auto: a small export is never a delta parent (the next release is full anyway)
        return not (self.deltas == "auto" and weights_bytes(local_dir) < self.delta_min_bytes)

    def _keep_parent(self, local_dir: str | os.PathLike[str], rel: Any) -> None:
        """Keep a copy of the export just published as the next delta's parent."""
        if not self._keeps_parent(local_dir):
            return
        src = Path(local_dir)
        keep = src.with_name(src.name + ".parent")
        if keep.exists():
            shutil.rmtree(keep)
        # hard links where the file system allows (the export is not read or written again),
        # else a copy; what each kept file looked like is recorded, and a kept copy that
        # changed since (a caller rewriting its export in place) is never a delta's parent
        shutil.copytree(src, keep, copy_function=link_or_copy)
        if self._parent is not None and self._parent[1] != keep:
            shutil.rmtree(self._parent[1], ignore_errors=True)  # one parent copy at a time
        self._parent = (rel, keep)
        self._parent_stat = _stat_dir(keep)


def _stat_dir(d: Path) -> list[tuple[str, int, int, int]]:
    out = []
    for p in sorted(Path(d).rglob("*")):
        if p.is_file():
            st = p.stat()
            out.append((p.relative_to(d).as_posix(), st.st_size, st.st_mtime_ns, st.st_ino))
    return out
