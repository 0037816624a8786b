"""Files a release shares with the previous one instead of storing them again.

A policy release is mostly the same few files each time: the weights change, the
model's ``config.json``, ``generation_config.json`` and tokenizer files do not. On a
remote store each stored file is a request (and a tokenizer of a real model is megabytes),
so a publication leaves out every file whose name, sha256 and size equal a file of the
release ``LATEST.json`` names when it publishes, and its manifest's ``shared`` maps that
name to the release whose directory holds the object (the first release that stored it:
a chain of releases never points through another). A reader fetches a shared file from
there and checks it against this manifest's digest as any other. Committed releases are
never overwritten, so the object a manifest names stays what it digested.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

from yeto_core.records import ShardDigest


def shared_with(files: Iterable[ShardDigest], previous: Optional[Any]) -> dict[str, str]:
    """``{name: release id holding it}`` for each of ``files`` equal (name, sha256, size) to
    a file ``previous`` (a committed :class:`~yeto_core.release.store.Release`, or None)
    names."""
    if previous is None:
        return {}
    before = {(f.name, f.sha256, f.size) for f in previous.files}
    holders = dict(previous.shared)
    return {
        f.name: holders.get(f.name, previous.release_id)
        for f in files
        if (f.name, f.sha256, f.size) in before
    }
