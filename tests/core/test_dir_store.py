"""The `dir` store: the ObjectStore contract plus what only a directory can get wrong."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from yeto_core.errors import InvalidKeyError, StoreError
from yeto_core.plugins import Plugins
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.store_contract import ObjectStoreContract


class TestDirStoreContract(ObjectStoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        return DirStore(tmp_path / "store")


class TestDirStoreContractNoFsync(ObjectStoreContract):
    """fsync=False (tests, scratch runs) keeps every other guarantee."""

    @pytest.fixture
    def store(self, tmp_path):
        return DirStore(tmp_path / "store", fsync=False)


# -- temp files, names, conflicts ---------------------------------------------------------


def test_temp_files_are_never_listed_and_their_names_are_refused(tmp_path):
    store = DirStore(tmp_path)
    store.put("buffer/index/000000000001.json", b"{}")
    # A writer killed between mkstemp and rename leaves such a file behind.
    (tmp_path / "buffer/index/.000000000002.json.tmp-abc123").write_bytes(b"partial")
    (tmp_path / ".top.tmp-x").write_bytes(b"partial")
    assert list(store.list()) == ["buffer/index/000000000001.json"]
    assert list(store.list("buffer/index/", after="buffer/index/000000000001.json")) == []
    with pytest.raises(InvalidKeyError, match="temporary file"):
        store.put("buffer/.x.tmp-1", b"")
    with pytest.raises(InvalidKeyError):
        store.get(".top.tmp-x")
    # Dot files that are not temp files are ordinary keys.
    store.put("cuts/.hidden", b"h")
    assert list(store.list("cuts/")) == ["cuts/.hidden"]


def test_no_temp_file_left_after_puts(tmp_path):
    store = DirStore(tmp_path)
    for i in range(5):
        store.put("a/k", str(i).encode())
        store.put_if_absent(f"a/p{i}", b"x")
        store.put_if_absent(f"a/p{i}", b"y")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == ["k", "p0", "p1", "p2", "p3", "p4"]


def test_object_and_prefix_conflicts_are_clear_errors(tmp_path):
    store = DirStore(tmp_path)
    store.put("a", b"object")
    with pytest.raises(StoreError, match="cannot hold both"):
        store.put("a/b", b"x")
    store.put("d/e", b"x")
    with pytest.raises(StoreError, match="prefix of other objects"):
        store.put("d", b"x")
    with pytest.raises(StoreError, match="prefix of other objects"):
        store.put_if_absent("d", b"x")
    with pytest.raises(StoreError, match="prefix"):
        store.delete("d")
    assert store.get("d/e") == b"x" and store.get("a") == b"object"


def test_put_recreates_a_directory_removed_behind_its_back(tmp_path):
    store = DirStore(tmp_path)
    store.put("x/y/1", b"1")
    for p in (tmp_path / "x/y").iterdir():
        p.unlink()
    (tmp_path / "x/y").rmdir()
    store.put("x/y/2", b"2")
    assert list(store.list("x/")) == ["x/y/2"]


def test_root_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(StoreError, match="not a directory"):
        DirStore(tmp_path / "f")


# -- list walks only what it must -----------------------------------------------------


def test_list_scans_only_directories_that_can_match(tmp_path, monkeypatch):
    store = DirStore(tmp_path, fsync=False)
    for d in ("a", "b", "c"):
        for i in range(3):
            store.put(f"{d}/{i}", b"")
    store.put("buffer/index/000000000001.json", b"")
    store.put("buffer/groups/g1.safetensors", b"")
    scanned = []
    real_scandir = os.scandir

    def recording_scandir(path):
        scanned.append(os.path.relpath(path, tmp_path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", recording_scandir)
    assert list(store.list("", after="b/zzz")) == [
        "buffer/groups/g1.safetensors",
        "buffer/index/000000000001.json",
        "c/0",
        "c/1",
        "c/2",
    ]
    assert "a" not in scanned  # pruned: every key under a/ sorts before b/zzz
    scanned.clear()
    assert list(store.list("buffer/index/0000", after="buffer/index/000000000000.json")) == [
        "buffer/index/000000000001.json"
    ]
    assert scanned == ["buffer/index"]


def test_list_many_entries_after_a_recent_key(tmp_path):
    store = DirStore(tmp_path, fsync=False)
    index = tmp_path / "buffer" / "index"
    index.mkdir(parents=True)
    n = 5000
    names = [f"{i:012d}.json" for i in range(n)]
    for name in reversed(names):  # directory order unrelated to key order
        (index / name).write_bytes(b"{}")
    after = f"buffer/index/{n - 4:012d}.json"
    assert list(store.list("buffer/index/", after=after)) == [
        f"buffer/index/{names[i]}" for i in range(n - 3, n)
    ]
    assert list(store.list("buffer/index/")) == [f"buffer/index/{x}" for x in names]


def test_list_is_lazy(tmp_path):
    store = DirStore(tmp_path, fsync=False)
    for i in range(3):
        store.put(f"p/{i}", b"")
    it = store.list("p/")
    store.put("p/10", b"")  # written after list() was called, before the first next()
    assert list(it) == ["p/0", "p/1", "p/10", "p/2"]


# -- URLs ------------------------------------------------------------------------------------


def test_file_urls_open_a_dir_store(tmp_path):
    pm = Plugins(entry_points=False)
    s1 = pm.open_store(f"file://{tmp_path}/s1")
    s2 = pm.open_store(f"file://localhost{tmp_path}/s2")
    s3 = pm.open_store(str(tmp_path / "s3"))
    s4 = pm.open_store(f"file://{tmp_path}/with%20space")
    for s, sub in ((s1, "s1"), (s2, "s2"), (s3, "s3"), (s4, "with space")):
        assert isinstance(s, DirStore)
        assert s.root == tmp_path / sub
        s.put("k", b"v")
        assert (tmp_path / sub / "k").read_bytes() == b"v"
        assert DirStore.from_url(s.url()).root == s.root
    assert pm.open_store(f"file://{tmp_path}/s1", fsync=False).fsync is False
    with pytest.raises(StoreError, match="names host"):
        DirStore.from_url("file://otherhost/tmp/x")
    with pytest.raises(StoreError, match="empty"):
        DirStore.from_url("")
    assert "DirStore(" in repr(s1)


# -- crash safety with real processes and SIGKILL ----------------------------------------

_WRITER = textwrap.dedent(
    """
    import hashlib, os, sys
    from yeto_core.stores.dir_store import DirStore

    root, start = sys.argv[1], int(sys.argv[2])
    store = DirStore(root)
    i = start
    while True:
        body = hashlib.sha256(str(i).encode()).digest() * (1 + (i % 5) * 40000)  # up to ~5 MB
        data = hashlib.sha256(body).digest() + body
        store.put(f"blob/obj-{i % 3}", data)
        store.put_if_absent(f"idx/{i:06d}", data)
        store.put_if_absent(f"idx/{i:06d}", b"never")
        print(i, flush=True)
        i += 1
    """
)


def _verify(data: bytes) -> bool:
    return len(data) >= 32 and hashlib.sha256(data[32:]).digest() == data[:32]


def test_sigkill_during_puts_never_leaves_a_partial_object(tmp_path):
    root = tmp_path / "store"
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    rng = random.Random(20240611)
    store = DirStore(root)
    start = 0
    kills = 5
    for _ in range(kills):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(root), str(start)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            want = rng.randint(1, 4)
            done = 0
            deadline = time.monotonic() + 60
            while done < want:
                line = proc.stdout.readline()
                assert line, f"writer exited early with {proc.wait()}"
                start = int(line) + 1
                done += 1
                assert time.monotonic() < deadline, "writer too slow"
            # Vary the kill point inside the next put (random, not a wait for a state).
            spin_until = time.monotonic() + rng.uniform(0, 0.05)
            while time.monotonic() < spin_until:
                pass
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(timeout=30)
            proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        keys = list(store.list())
        assert keys, "nothing was written"
        for key in keys:
            assert ".tmp-" not in key
            assert _verify(store.get(key)), f"{key} is partial after SIGKILL"
        idx = [k for k in keys if k.startswith("idx/")]
        assert idx == [f"idx/{i:06d}" for i in range(len(idx))], "index has a hole"
        # Leftover temp files may exist on disk (killed mid-write), never as keys.


def test_core_and_the_testing_package_do_not_import_pytest():
    code = (
        "import sys, yeto_core, yeto_core.plugins, yeto_core.stores.dir_store, yeto_core.testing\n"
        "assert 'pytest' not in sys.modules, 'yeto_core imported pytest'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_swap_fsyncs_its_version_not_the_listed_copy(tmp_path, monkeypatch):
    """put_if_match makes the new version durable (the version file and its directory);
    the key's own file is a copy for list/exists/watchers: get and get_versioned never
    read it, so a copy lost or torn by a power cut loses nothing."""
    store = DirStore(tmp_path / "s")
    v1 = store.put_if_match("run/LATEST.json", b"one", None)
    synced: list[str] = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    v2 = store.put_if_match("run/LATEST.json", b"two", v1)
    monkeypatch.undo()
    assert v2 is not None and len(synced) == 2
    assert all(".LATEST.json.tmp-cas" in p for p in synced), synced
    copy = tmp_path / "s" / "run" / "LATEST.json"
    assert copy.read_bytes() == b"two"
    torn = copy.with_name("torn")  # what a power cut may leave of an unsynced rename: the
    torn.write_bytes(b"")  # name on an empty file (the version it links is fsynced and
    os.replace(torn, copy)  # never written again)
    assert store.get("run/LATEST.json") == b"two"
    assert store.get_versioned("run/LATEST.json") == (b"two", v2)
    assert store.exists("run/LATEST.json")
    assert store.put_if_match("run/LATEST.json", b"three", v2) is not None
    assert copy.read_bytes() == b"three"


def test_a_writer_paused_while_others_swap_far_ahead_does_not_win(tmp_path, monkeypatch):
    """A writer reads version n, pauses while the others swap on (far enough that n + 1's
    bytes are dropped), then links n + 1: the number is still taken, so it loses. When old
    versions were deleted, it created n + 1 again and was told it had won (a lost update)."""
    store = DirStore(tmp_path / "s", fsync=False)
    store.put_if_match("run/consumed.json", b"0", None)
    _data, stale = store.get_versioned("run/consumed.json")
    real = DirStore._create_version

    def paused(self, key, path, seq, payload):
        monkeypatch.setattr(DirStore, "_create_version", real)
        cur = stale
        for i in range(1, 11):
            cur = store.put_if_match("run/consumed.json", b"%d" % i, cur)
            assert cur is not None
        return real(self, key, path, seq, payload)

    monkeypatch.setattr(DirStore, "_create_version", paused)
    assert store.put_if_match("run/consumed.json", b"stale", stale) is None
    assert store.get("run/consumed.json") == b"10"


def test_swaps_across_shards_keep_every_old_number_taken(tmp_path):
    store = DirStore(tmp_path / "s", fsync=False)
    v = store.put_if_match("k", b"", None)  # an empty value is a value, not a dropped one
    assert store.get("k") == b"" and store.exists("k")
    for i in range(1, 600):
        v = store.put_if_match("k", b"%d" % i, v)
        assert v is not None
    assert store.get_versioned("k") == (b"599", "v600")
    cdir = tmp_path / "s" / ".k.tmp-cas"
    assert sorted(p.name for p in cdir.iterdir()) == ["s00000000", "s00000001", "s00000002"]
    kept = [p for p in cdir.rglob("0*") if p.stat().st_size > 0]
    assert sorted(int(p.name) for p in kept) == list(range(596, 601))  # the last five
    for old in (1, 255, 256, 257, 590):  # every dropped number, shard edges included
        assert store.put_if_match("k", b"stale", f"v{old}") is None
        assert store._create_version("k", tmp_path / "s" / "k", old + 1, b"stale") is False
    assert store.get("k") == b"599"


def test_versions_written_before_shards_are_read_and_stay_taken(tmp_path):
    store = DirStore(tmp_path / "s", fsync=False)
    cdir = tmp_path / "s" / ".k.tmp-cas"
    cdir.mkdir(parents=True)
    for seq in (6, 7):  # the layout before shards: numbered files in the folder itself
        (cdir / f"{seq:012d}").write_bytes(b"old-%d" % seq)
    assert store.get_versioned("k") == (b"old-7", "v7")
    assert store.put_if_match("k", b"stale", "v6") is None
    assert store._create_version("k", tmp_path / "s" / "k", 7, b"x") is False
    v = store.put_if_match("k", b"new", "v7")
    assert v == "v8" and store.get("k") == b"new"
    for i in range(6):
        v = store.put_if_match("k", b"n%d" % i, v)
    assert (cdir / f"{7:012d}").stat().st_size == 0  # dropped in place, its number taken
    assert store._create_version("k", tmp_path / "s" / "k", 7, b"x") is False


def test_a_swaps_listed_copy_is_a_link_to_its_version_not_a_second_file(tmp_path):
    store = DirStore(tmp_path / "s")
    v = store.put_if_match("run/LATEST.json", b"one", None)
    for i in range(3):
        v = store.put_if_match("run/LATEST.json", b"n%d" % i, v)
    seq = int(v[1:])
    version = tmp_path / "s" / "run" / ".LATEST.json.tmp-cas" / "s00000000" / f"{seq:012d}"
    listed = tmp_path / "s" / "run" / "LATEST.json"
    assert listed.stat().st_ino == version.stat().st_ino and listed.read_bytes() == b"n2"
    assert not [n for n in os.listdir(listed.parent) if ".tmp-" in n and "cas" not in n]


def test_a_late_listed_copy_of_a_dropped_version_is_written_out(tmp_path):
    """A writer paused between its version and its listed copy while the others swapped
    far on (its version dropped to the tomb): its copy holds its bytes, not the tomb's."""
    store = DirStore(tmp_path / "s", fsync=False)
    v = store.put_if_match("k", b"first", None)
    for i in range(8):
        v = store.put_if_match("k", b"v%d" % i, v)
    path = tmp_path / "s" / "k"
    store._mirror("k", path, b"first", 1)  # version 1 is a tomb by now
    assert path.read_bytes() == b"first"
    assert store.get("k") == b"v7"


def test_a_swap_after_the_key_was_deleted_behind_the_stores_back(tmp_path):
    store = DirStore(tmp_path / "s", fsync=False)
    v = store.put_if_match("run/c.json", b"1", None)
    v = store.put_if_match("run/c.json", b"2", v)
    DirStore(tmp_path / "s", fsync=False).delete("run/c.json")  # another process
    assert store.put_if_match("run/c.json", b"stale", v) is None
    v = store.put_if_match("run/c.json", b"again", None)
    assert v == "v1" and store.get_versioned("run/c.json") == (b"again", "v1")
    assert store.put_if_match("run/c.json", b"next", v) == "v2"


def test_a_read_of_a_swapped_key_probes_on_from_the_newest_version_it_saw(tmp_path, monkeypatch):
    """A reader finds versions another process swapped in since its last read without
    listing the shard (lstat of the next numbers), and lists again when the number it
    saw is gone (the key deleted and written again, its numbers starting over)."""
    reader, writer = DirStore(tmp_path / "s"), DirStore(tmp_path / "s")
    v = writer.put_if_match("run/c.json", b"0", None)
    assert reader.get_versioned("run/c.json") == (b"0", "v1")  # listed: the first read
    for i in range(1, 300):  # across a shard boundary (256)
        v = writer.put_if_match("run/c.json", b"%d" % i, v)
    listed: list[str] = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p=".": (listed.append(str(p)), real(p))[1])
    assert reader.get_versioned("run/c.json") == (b"299", "v300")
    assert listed == []
    monkeypatch.undo()
    writer.delete("run/c.json")
    w = writer.put_if_match("run/c.json", b"new", None)
    assert reader.get_versioned("run/c.json") == (b"new", w) == (b"new", "v1")
    assert reader.put_if_match("run/c.json", b"stale", v) is None
    assert reader.put_if_match("run/c.json", b"next", w) == "v2"
    writer.delete("run/c.json")
    assert not reader.exists("run/c.json")
    with pytest.raises(KeyError):
        reader.get("run/c.json")


# -- put_files: a handed-over file becomes the object (hard link) ---------------------------


def _handed(tmp_path, name="model.safetensors", data=b"w" * 4096):
    src = tmp_path / "scratch"
    src.mkdir(exist_ok=True)
    (src / name).write_bytes(data)
    os.chmod(src / name, 0o600)  # as an export may leave it
    return src / name


def test_put_files_links_the_file_into_place_after_fsyncing_it(tmp_path, monkeypatch):
    from yeto_core.stores import dir_store
    from yeto_core.stores.files import FILE_MODE

    store = DirStore(tmp_path / "s")
    src = _handed(tmp_path)
    synced: list[int] = []
    real = dir_store._fsync_all
    monkeypatch.setattr(
        dir_store,
        "_fsync_all",
        lambda fds: (synced.extend(os.fstat(f).st_ino for f in fds), real(fds)),
    )
    store.put_files([("rel/1/model.safetensors", src)])
    obj = tmp_path / "s" / "rel" / "1" / "model.safetensors"
    assert obj.stat().st_ino == src.stat().st_ino  # the file itself: no copy written
    assert synced == [src.stat().st_ino]  # its bytes durable before its name
    assert obj.stat().st_mode & 0o777 == FILE_MODE  # the mode every stored object has
    src.unlink()  # the caller removes its scratch name: the object stays
    assert store.get("rel/1/model.safetensors") == b"w" * 4096
    assert not [n for n in os.listdir(obj.parent) if ".tmp-" in n]


def test_put_files_replaces_an_object_already_there(tmp_path):
    store = DirStore(tmp_path / "s")
    store.put("rel/1/config.json", b"old")
    src = _handed(tmp_path, "config.json", b"new")
    store.put_files([("rel/1/config.json", src)])
    assert store.get("rel/1/config.json") == b"new"
    assert (tmp_path / "s" / "rel" / "1" / "config.json").stat().st_ino == src.stat().st_ino
    assert not [n for n in os.listdir(tmp_path / "s" / "rel" / "1") if ".tmp-" in n]


def test_put_files_copies_a_file_with_other_names(tmp_path):
    """A file the caller also keeps under another name (a link it may write through) is
    copied: the object must not change with it."""
    store = DirStore(tmp_path / "s")
    src = _handed(tmp_path)
    os.link(src, tmp_path / "kept")
    store.put_files([("rel/1/model.safetensors", src)])
    obj = tmp_path / "s" / "rel" / "1" / "model.safetensors"
    assert obj.stat().st_ino != src.stat().st_ino
    (tmp_path / "kept").write_bytes(b"changed in place")
    assert store.get("rel/1/model.safetensors") == b"w" * 4096


def test_put_files_copies_what_the_file_system_will_not_link(tmp_path, monkeypatch):
    import errno

    store = DirStore(tmp_path / "s")
    src = _handed(tmp_path)

    def cross_device(a, b, *args, **kw):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    store.put_files([("rel/1/model.safetensors", src)])
    monkeypatch.undo()
    obj = tmp_path / "s" / "rel" / "1" / "model.safetensors"
    assert obj.stat().st_ino != src.stat().st_ino
    assert store.get("rel/1/model.safetensors") == b"w" * 4096


def test_put_files_refuses_a_key_that_is_a_prefix(tmp_path):
    store = DirStore(tmp_path / "s")
    store.put("rel/1/x/y", b"deeper")
    with pytest.raises(StoreError, match="prefix"):
        store.put_files([("rel/1/x", _handed(tmp_path))])
    assert store.get("rel/1/x/y") == b"deeper"
