"""The behaviour every :class:`~yeto_core.ports.ObjectStore` must have, as pytest tests.

Subclass :class:`ObjectStoreContract` and define a ``store`` fixture that
returns a fresh, empty store for each test (for a shared service, a store
rooted at a unique prefix)::

    class TestDirStore(ObjectStoreContract):
        @pytest.fixture
        def store(self, tmp_path):
            return DirStore(tmp_path / "store")

Keys used here never make one key a prefix-directory of another (``a`` and
``a/b``), which a directory store cannot hold.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from yeto_core.errors import InvalidKeyError, NotFoundError, StoreError
from yeto_core.ports import ObjectStore

#: Keys every store must refuse, for every verb.
INVALID_KEYS = (
    "",
    ".",
    "..",
    "../x",
    "a/../b",
    "a/./b",
    "./a",
    "/abs",
    "/",
    "a//b",
    "a/",
    "a\x00b",
    "a\\b",
    "\\a",
)

#: List prefixes every store must refuse.
INVALID_PREFIXES = ("/", "/abs", "../", "a/../", "a//", "a\x00", "a\\b/", "./")

#: Keys chosen so that character order ('-' < '/' < '0') and nesting interact.
ORDER_KEYS = (
    "x/a-b",
    "x/a/b",
    "x/a/c/d",
    "x/a/c/e",
    "x/a0",
    "x/b",
    "x/ü nicode key.json",
)


def _keys(it: Iterator[str]) -> list[str]:
    out = list(it)
    assert all(isinstance(k, str) for k in out), out
    return out


def race_put_if_absent(store: ObjectStore, key: str, n: int) -> list[tuple[int, bool]]:
    """``n`` threads call ``put_if_absent(key, b"writer-<i>")`` at once; return (i, won)."""
    barrier = threading.Barrier(n)
    results: list[tuple[int, bool]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def contender(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            won = store.put_if_absent(key, f"writer-{i}".encode())
            with lock:
                results.append((i, won))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return sorted(results)


class ObjectStoreContract:
    """Abstract contract tests; subclasses provide the ``store`` fixture."""

    @pytest.fixture
    def store(self) -> ObjectStore:  # pragma: no cover - always overridden
        raise NotImplementedError("subclass ObjectStoreContract and define a `store` fixture")

    # -- get / put -----------------------------------------------------------------------

    def test_put_then_get_roundtrip(self, store: ObjectStore) -> None:
        store.put("a/b/c.json", b'{"x": 1}')
        assert store.get("a/b/c.json") == b'{"x": 1}'
        assert isinstance(store.get("a/b/c.json"), bytes)

    def test_put_overwrites(self, store: ObjectStore) -> None:
        store.put("k", b"first")
        store.put("k", b"second, longer")
        assert store.get("k") == b"second, longer"
        store.put("k", b"3")
        assert store.get("k") == b"3"

    def test_put_files_stores_each_files_bytes(self, store: ObjectStore, tmp_path: Any) -> None:
        """``put_files`` (the release upload): each file's bytes under its key, over an
        object already there; what the caller does to its names afterwards (removing
        its scratch directory) leaves the objects as they were put."""
        src = tmp_path / "put-files"
        src.mkdir()
        (src / "w.bin").write_bytes(b"\x00weights" * 1000)
        (src / "c.json").write_bytes(b'{"c": 1}')
        store.put("rel/1/c.json", b"an older object")
        store.put_files([("rel/1/w.bin", src / "w.bin"), ("rel/1/c.json", src / "c.json")])
        for name in ("w.bin", "c.json"):
            (src / name).unlink()
        src.rmdir()
        assert store.get("rel/1/w.bin") == b"\x00weights" * 1000
        assert store.get("rel/1/c.json") == b'{"c": 1}'
        assert _keys(store.list("rel/")) == ["rel/1/c.json", "rel/1/w.bin"]

    def test_put_accepts_bytearray_and_memoryview(self, store: ObjectStore) -> None:
        store.put("ba", bytearray(b"abc"))
        store.put("mv", memoryview(b"defg"))
        assert store.get("ba") == b"abc"
        assert store.get("mv") == b"defg"

    def test_readers_never_see_a_partial_overwrite(self, store: ObjectStore) -> None:
        size = 512 * 1024
        versions = [bytes([i]) * size for i in range(4)]
        store.put("big", versions[0])
        stop = threading.Event()
        seen: list[bytes] = []
        errors: list[BaseException] = []

        def reader() -> None:
            try:
                while not stop.is_set():
                    seen.append(store.get("big"))
            except BaseException as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=reader)
        t.start()
        try:
            for i in range(12):
                store.put("big", versions[i % len(versions)])
        finally:
            stop.set()
            t.join(timeout=60)
        assert not errors, errors
        assert seen, "the reader thread read nothing"
        assert all(s in versions for s in seen), "a reader saw a torn or partial object"

    def test_binary_data_roundtrip(self, store: ObjectStore) -> None:
        data = bytes(range(256)) * 17 + b"\x00\r\n\xff"
        store.put("bin/all-bytes", data)
        assert store.get("bin/all-bytes") == data

    def test_large_object_roundtrip(self, store: ObjectStore) -> None:
        data = bytes((i * 7919) % 251 for i in range(3 * 1024 * 1024 + 13))
        store.put("large/blob", data)
        assert store.get("large/blob") == data

    def test_empty_object(self, store: ObjectStore) -> None:
        store.put("empty", b"")
        assert store.get("empty") == b""
        assert store.exists("empty")
        assert _keys(store.list("empty")) == ["empty"]
        assert store.put_if_absent("empty2", b"") is True
        assert store.get("empty2") == b""
        assert store.put_if_absent("empty2", b"x") is False
        assert store.get("empty2") == b""

    def test_get_missing_raises_not_found(self, store: ObjectStore) -> None:
        with pytest.raises(NotFoundError) as info:
            store.get("no/such/key")
        assert isinstance(info.value, KeyError) and isinstance(info.value, StoreError)
        assert "no/such/key" in str(info.value)

    def test_get_of_a_prefix_is_not_found(self, store: ObjectStore) -> None:
        store.put("dir/inner", b"1")
        with pytest.raises(NotFoundError):
            store.get("dir")
        assert not store.exists("dir")

    def test_unicode_and_spaces_in_keys(self, store: ObjectStore) -> None:
        key = "x/ü nicode key.json"
        store.put(key, b"u")
        assert store.get(key) == b"u"
        assert _keys(store.list("x/")) == [key]

    # -- put_if_absent ------------------------------------------------------------------

    def test_put_if_absent_creates_once(self, store: ObjectStore) -> None:
        assert store.put_if_absent("idx/000001.json", b"first") is True
        assert store.get("idx/000001.json") == b"first"
        assert store.put_if_absent("idx/000001.json", b"second") is False
        assert store.get("idx/000001.json") == b"first"

    def test_put_if_absent_after_put_returns_false(self, store: ObjectStore) -> None:
        store.put("p", b"put")
        assert store.put_if_absent("p", b"other") is False
        assert store.get("p") == b"put"

    def test_put_if_absent_after_delete_creates_again(self, store: ObjectStore) -> None:
        assert store.put_if_absent("d", b"1") is True
        store.delete("d")
        assert store.put_if_absent("d", b"2") is True
        assert store.get("d") == b"2"

    def test_concurrent_put_if_absent_has_exactly_one_winner(self, store: ObjectStore) -> None:
        for r in range(3):
            key = f"race/{r:06d}.json"
            results = race_put_if_absent(store, key, n=8)
            winners = [i for i, won in results if won]
            assert len(results) == 8
            assert len(winners) == 1, f"round {r}: winners {winners}"
            assert store.get(key) == f"writer-{winners[0]}".encode()

    # -- compare-and-swap (put_if_match) -------------------------------------------------

    def test_put_if_match_creates_only_when_absent(self, store: ObjectStore) -> None:
        v1 = store.put_if_match("cas/new", b"one", None)
        assert isinstance(v1, str) and v1
        assert store.put_if_match("cas/new", b"two", None) is None
        data, version = store.get_versioned("cas/new")
        assert data == b"one" and version == v1

    def test_put_if_match_swaps_only_from_the_version_read(self, store: ObjectStore) -> None:
        store.put("cas/k", b"first")
        data, v1 = store.get_versioned("cas/k")
        assert data == b"first"
        v2 = store.put_if_match("cas/k", b"second", v1)
        assert v2 is not None and v2 != v1
        assert store.get("cas/k") == b"second"
        # a writer still holding the old version loses and changes nothing
        assert store.put_if_match("cas/k", b"stale writer", v1) is None
        assert store.get_versioned("cas/k") == (b"second", v2)
        assert store.put_if_match("cas/k", b"third", v2) is not None
        assert store.get("cas/k") == b"third"

    def test_put_if_match_on_a_missing_key_with_a_version_is_refused(
        self, store: ObjectStore
    ) -> None:
        store.put("cas/gone", b"x")
        _, v = store.get_versioned("cas/gone")
        store.delete("cas/gone")
        assert store.put_if_match("cas/gone", b"y", v) is None
        assert not store.exists("cas/gone")
        with pytest.raises(NotFoundError):
            store.get_versioned("cas/gone")

    def test_concurrent_put_if_match_from_one_version_has_exactly_one_winner(
        self, store: ObjectStore
    ) -> None:
        if not store.ATOMIC_CAS:
            pytest.skip(f"{type(store).__name__}.put_if_match is not atomic (ATOMIC_CAS False)")
        store.put("cas/race", b"start")
        _, v0 = store.get_versioned("cas/race")
        n = 8
        barrier = threading.Barrier(n)
        won: list[int] = []
        errors: list[BaseException] = []

        def contender(i: int) -> None:
            try:
                barrier.wait(timeout=30)
                if store.put_if_match("cas/race", f"writer-{i}".encode(), v0) is not None:
                    won.append(i)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=contender, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        assert len(won) == 1, won
        assert store.get("cas/race") == f"writer-{won[0]}".encode()

    def test_read_modify_cas_loops_lose_no_update(self, store: ObjectStore) -> None:
        if not store.ATOMIC_CAS:
            pytest.skip(f"{type(store).__name__}.put_if_match is not atomic (ATOMIC_CAS False)")
        store.put("cas/counter", b"0")
        n, per = 4, 5
        errors: list[BaseException] = []

        def incrementer() -> None:
            try:
                for _ in range(per):
                    for _attempt in range(1000):
                        data, v = store.get_versioned("cas/counter")
                        if store.put_if_match("cas/counter", b"%d" % (int(data) + 1), v):
                            break
                    else:
                        raise AssertionError("a CAS loop never won in 1000 tries")
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=incrementer) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        assert int(store.get("cas/counter")) == n * per

    # -- exists ----------------------------------------------------------------------------

    def test_exists(self, store: ObjectStore) -> None:
        assert store.exists("e/1") is False
        store.put("e/1", b"x")
        assert store.exists("e/1") is True
        assert store.exists("e") is False
        assert store.exists("e/2") is False

    # -- list ------------------------------------------------------------------------------

    def test_list_empty_store(self, store: ObjectStore) -> None:
        assert _keys(store.list()) == []
        assert _keys(store.list("nothing/here/")) == []
        assert _keys(store.list("nothing", after="a")) == []

    def test_list_is_in_key_order_across_nesting(self, store: ObjectStore) -> None:
        for k in reversed(ORDER_KEYS):
            store.put(k, k.encode())
        assert _keys(store.list()) == sorted(ORDER_KEYS)
        assert _keys(store.list("x/")) == sorted(ORDER_KEYS)

    def test_list_after_is_strict(self, store: ObjectStore) -> None:
        for k in ORDER_KEYS:
            store.put(k, b"")
        ordered = sorted(ORDER_KEYS)
        for i, k in enumerate(ordered):
            assert _keys(store.list("x/", after=k)) == ordered[i + 1 :], k
        # `after` need not exist, and may name a prefix-directory.
        assert _keys(store.list("x/", after="x/a/")) == [
            "x/a/b",
            "x/a/c/d",
            "x/a/c/e",
            "x/a0",
            "x/b",
            "x/ü nicode key.json",
        ]
        assert _keys(store.list("x/", after="x/a/c")) == [
            "x/a/c/d",
            "x/a/c/e",
            "x/a0",
            "x/b",
            "x/ü nicode key.json",
        ]
        assert _keys(store.list("x/", after="x/a/c/")) == [
            "x/a/c/d",
            "x/a/c/e",
            "x/a0",
            "x/b",
            "x/ü nicode key.json",
        ]
        assert _keys(store.list("x/", after="x/a/c/z")) == ["x/a0", "x/b", "x/ü nicode key.json"]
        assert _keys(store.list("x/", after="x/zzz")) == ["x/ü nicode key.json"]
        assert _keys(store.list("x/", after="y")) == []
        # `after` before the prefix lists the whole prefix.
        assert _keys(store.list("x/a/", after="a")) == ["x/a/b", "x/a/c/d", "x/a/c/e"]
        assert _keys(store.list("", after="")) == ordered

    def test_list_prefix_filters_mid_name(self, store: ObjectStore) -> None:
        keys = [f"buffer/index/{i:012d}.json" for i in range(25)]
        others = ["buffer/index.jsonl", "buffer/indexes/0", "buffer/index2/000000000001.json"]
        for k in keys + others:
            store.put(k, b"{}")
        assert _keys(store.list("buffer/index/")) == keys
        assert _keys(store.list("buffer/index/0000")) == keys
        assert _keys(store.list("buffer/index/00000000001")) == keys[10:20]
        assert _keys(store.list("buffer/index/00000000001", after=keys[14])) == keys[15:20]
        assert _keys(store.list("buffer/index/000000000024.json")) == [keys[24]]
        assert _keys(store.list("buffer/index/000000000024.json", after=keys[24])) == []
        assert _keys(store.list("buffer/index")) == sorted(keys + others)
        assert _keys(store.list("buffer/index/", after=keys[22])) == keys[23:]
        assert _keys(store.list("buffer/ind")) == sorted(keys + others)
        assert _keys(store.list("buffer/x")) == []

    def test_list_prefix_nested_dirs(self, store: ObjectStore) -> None:
        for k in ORDER_KEYS:
            store.put(k, b"")
        assert _keys(store.list("x/a")) == ["x/a-b", "x/a/b", "x/a/c/d", "x/a/c/e", "x/a0"]
        assert _keys(store.list("x/a/")) == ["x/a/b", "x/a/c/d", "x/a/c/e"]
        assert _keys(store.list("x/a/c")) == ["x/a/c/d", "x/a/c/e"]
        assert _keys(store.list("x/a/c/d")) == ["x/a/c/d"]
        assert _keys(store.list("x/a/c/d/")) == []

    def test_list_does_not_show_deleted(self, store: ObjectStore) -> None:
        store.put("l/1", b"")
        store.put("l/2", b"")
        store.delete("l/1")
        assert _keys(store.list("l/")) == ["l/2"]

    # -- delete ---------------------------------------------------------------------------

    def test_delete(self, store: ObjectStore) -> None:
        store.put("del/me", b"x")
        store.delete("del/me")
        assert not store.exists("del/me")
        with pytest.raises(NotFoundError):
            store.get("del/me")

    def test_delete_missing_is_not_an_error(self, store: ObjectStore) -> None:
        store.delete("never/was")
        store.put("once", b"")
        store.delete("once")
        store.delete("once")
        assert not store.exists("once")

    # -- invalid keys -----------------------------------------------------------------------

    @pytest.mark.parametrize("key", INVALID_KEYS, ids=repr)
    def test_invalid_key_refused_by_every_verb(self, store: ObjectStore, key: str) -> None:
        for verb, call in (
            ("get", lambda: store.get(key)),
            ("put", lambda: store.put(key, b"x")),
            ("put_if_absent", lambda: store.put_if_absent(key, b"x")),
            ("exists", lambda: store.exists(key)),
            ("delete", lambda: store.delete(key)),
        ):
            with pytest.raises(InvalidKeyError):
                call()
                pytest.fail(f"{verb}({key!r}) was accepted")
        assert _keys(store.list()) == [], "a refused key left an object behind"

    @pytest.mark.parametrize("prefix", INVALID_PREFIXES, ids=repr)
    def test_invalid_list_prefix_refused(self, store: ObjectStore, prefix: str) -> None:
        with pytest.raises(InvalidKeyError):
            _keys(store.list(prefix))

    def test_non_string_key_refused(self, store: ObjectStore) -> None:
        with pytest.raises(InvalidKeyError):
            store.get(b"bytes-key")  # type: ignore[arg-type]
        with pytest.raises(InvalidKeyError):
            store.put(None, b"")  # type: ignore[arg-type]
