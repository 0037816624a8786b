"""Gap 8: files of a ``dir`` store are created with one permission mode.

Regression: objects written through a temporary file (``put``, ``put_many``, the
compare-and-swap versions) were created 0600 by ``mkstemp``, while ``put_if_absent``
objects and the buffer's index were 0644: a run dir shared with a group (a dashboard
under another user, a backup job) could read some of a run and not the rest. Every file
is now created like ``open()`` creates one: 0666 less the process umask.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.groups import build_group


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


def test_every_file_of_a_dir_store_and_its_buffer_gets_the_same_mode(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store", fsync=False)
    store.put("a/put.json", b"1")
    assert store.put_if_absent("a/create.json", b"1")
    store.put_many([("a/many1.json", b"1"), ("a/many2.json", b"2")])
    store.put_many_if_absent([("a/mc1.json", b"1")])
    v = store.put_if_match("a/cas.json", b"1", None)
    store.put_if_match("a/cas.json", b"2", v)
    buf = FileSampleBuffer(store, layout="jsonl")
    buf.append(build_group("g0", n=2, host="h1"))
    want = 0o666 & ~_umask()
    modes = {
        str(p.relative_to(store.root)): stat.S_IMODE(p.stat().st_mode)
        for p in Path(store.root).rglob("*")
        if p.is_file()
    }
    assert modes and {m for m in modes.values()} == {want}, {
        k: oct(m) for k, m in modes.items() if m != want
    }
