"""TreeMirror against the s3 store on a real S3-compatible server (moto)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from yeto_core.ports import ObjectStore
from yeto_s3.tree_mirror import INDEX_NAME, MirrorError, TreeMirror


class Recording(ObjectStore):
    """Delegates to a real store and records every write, in order."""

    PLUGIN_NAME = "recording"

    def __init__(self, inner, on_get=None):
        self.inner, self.ops, self.on_get = inner, [], on_get

    @classmethod
    def from_url(cls, url, **options):  # pragma: no cover - never opened by URL
        raise NotImplementedError

    def get(self, key):
        if self.on_get is not None:
            self.on_get(key)
        return self.inner.get(key)

    def put(self, key, data):
        self.ops.append(("put", key))
        self.inner.put(key, data)

    def put_if_absent(self, key, data):
        self.ops.append(("put_if_absent", key))
        return self.inner.put_if_absent(key, data)

    def exists(self, key):
        return self.inner.exists(key)

    def list(self, prefix="", after=None):
        return self.inner.list(prefix, after)

    def delete(self, key):
        self.ops.append(("delete", key))
        self.inner.delete(key)

    def __repr__(self):
        return f"Recording({self.inner!r})"


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


RUN = {
    "cuts/c00000001-i1-stop/model.safetensors": b"\x00weights-1" * 100,
    "cuts/c00000001-i1-stop/manifest.json": b'{"cut": 1}',
    "cuts/LATEST": b"c00000001-i1-stop\n",
    "releases/1/model.safetensors": b"release-1",
    "releases/1/manifest.json": b'{"release_id": "1"}',
    "releases/LATEST.json": json.dumps({"release_id": "1", "version": 1}).encode(),
    "deep/er/x/LATEST": b"v1",
    "deep/er/x/v1/data": b"d",
    "head/journal.jsonl": b'{"a": 1}\n',
}


def test_push_uploads_data_then_pointers_deepest_first_then_index(tmp_path, s3_store):
    src = tmp_path / "src"
    _write(src, RUN)
    (src / "cuts" / ".model.tmp-abc").write_bytes(b"partial")  # never mirrored
    rec = Recording(s3_store)
    result = TreeMirror(src, rec, prefix="mirror").push()
    puts = [k for op, k in rec.ops if op == "put"]
    assert puts == ["mirror/" + r for r in result.uploaded] + ["mirror/" + INDEX_NAME]
    pointers = ["mirror/deep/er/x/LATEST", "mirror/cuts/LATEST", "mirror/releases/LATEST.json"]
    assert puts[-4:-1] == pointers
    assert sorted(puts[:-4]) == sorted(
        "mirror/" + r for r in RUN if not r.endswith(("LATEST", "LATEST.json"))
    )
    assert not any(".tmp-" in k for k in puts)
    assert result.deleted == () and result.unchanged == 0


def test_push_then_pull_roundtrip_and_nothing_to_do_twice(tmp_path, s3_store):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _write(src, RUN)
    TreeMirror(src, s3_store, prefix="m").push()
    pulled = TreeMirror(dst, s3_store, prefix="m").pull()
    assert _tree(dst) == RUN
    assert set(pulled.downloaded) == set(RUN) and pulled.attempts == 1
    rec = Recording(s3_store)
    again = TreeMirror(src, rec, prefix="m").push()
    assert again.uploaded == () and again.unchanged == len(RUN)
    assert [k for op, k in rec.ops] == ["m/" + INDEX_NAME]
    assert TreeMirror(dst, s3_store, prefix="m").pull().downloaded == ()


def test_changed_file_only_is_uploaded_and_pruned_files_are_deleted(tmp_path, s3_store):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _write(src, RUN)
    TreeMirror(src, s3_store, prefix="m").push()
    TreeMirror(dst, s3_store, prefix="m").pull()
    # A new cut replaces the old one; the journal grows.
    old = "cuts/c00000001-i1-stop"
    for p in (src / old).iterdir():
        p.unlink()
    (src / old).rmdir()
    _write(
        src,
        {
            "cuts/c00000002-i1-stop/model.safetensors": b"weights-2",
            "cuts/c00000002-i1-stop/manifest.json": b'{"cut": 2}',
            "cuts/LATEST": b"c00000002-i1-stop\n",
            "head/journal.jsonl": b'{"a": 1}\n{"b": 2}\n',
        },
    )
    rec = Recording(s3_store)
    result = TreeMirror(src, rec, prefix="m").push()
    assert result.uploaded == (
        "cuts/c00000002-i1-stop/manifest.json",
        "cuts/c00000002-i1-stop/model.safetensors",
        "head/journal.jsonl",
        "cuts/LATEST",
    )
    deletes = [k for op, k in rec.ops if op == "delete"]
    assert deletes == [f"m/{old}/manifest.json", f"m/{old}/model.safetensors"]
    last_put = max(i for i, (op, _) in enumerate(rec.ops) if op == "put")
    assert all(i > last_put for i, (op, _) in enumerate(rec.ops) if op == "delete")
    assert not list(s3_store.list(f"m/{old}"))
    pulled = TreeMirror(dst, s3_store, prefix="m").pull()
    assert _tree(dst) == _tree(src)
    assert set(pulled.removed) == {f"{old}/manifest.json", f"{old}/model.safetensors"}
    assert not (dst / old).exists(), "emptied directories are removed too"


def test_object_deleted_remotely_is_uploaded_again(tmp_path, s3_store):
    src = tmp_path / "src"
    _write(src, RUN)
    TreeMirror(src, s3_store, prefix="m").push()
    s3_store.delete("m/releases/1/model.safetensors")
    result = TreeMirror(src, s3_store, prefix="m").push()
    assert result.uploaded == ("releases/1/model.safetensors",)
    assert s3_store.get("m/releases/1/model.safetensors") == b"release-1"


def test_pull_refuses_a_pointer_whose_target_is_missing(tmp_path, s3_store):
    s3_store.put("m/cuts/LATEST", b"c00000009-i1-stop")
    s3_store.put("m/cuts/c00000001-i1-stop/manifest.json", b"{}")
    with pytest.raises(MirrorError, match="c00000009-i1-stop"):
        TreeMirror(tmp_path / "dst", s3_store, prefix="m", max_pull_attempts=2).pull()
    assert not (tmp_path / "dst" / "cuts" / "LATEST").exists()
    s3_store.put("m/releases/LATEST.json", json.dumps({"release_id": "7"}).encode())
    s3_store.put("m/cuts/LATEST", b"c00000001-i1-stop")
    with pytest.raises(MirrorError, match="releases/7"):
        TreeMirror(tmp_path / "dst", s3_store, prefix="m", max_pull_attempts=1).pull()


def test_pull_starts_over_when_a_push_commits_during_download(tmp_path, s3_store):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _write(src, RUN)
    TreeMirror(src, s3_store, prefix="m").push()
    # Prepare the writer's next state, pushed while the reader downloads.
    _write(
        src,
        {
            "releases/2/model.safetensors": b"release-2",
            "releases/2/manifest.json": b'{"release_id": "2"}',
            "releases/LATEST.json": json.dumps({"release_id": "2", "version": 2}).encode(),
        },
    )
    pushed = []

    def push_once(key):
        if not pushed and key.endswith("model.safetensors"):
            pushed.append(TreeMirror(src, s3_store, prefix="m").push())

    result = TreeMirror(dst, Recording(s3_store, on_get=push_once), prefix="m").pull()
    assert pushed and result.attempts == 2
    assert _tree(dst) == _tree(src)
    assert json.loads((dst / "releases/LATEST.json").read_bytes())["release_id"] == "2"


def test_pull_removes_local_files_not_remote_and_ignores_local_temp(tmp_path, s3_store):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _write(src, RUN)
    TreeMirror(src, s3_store, prefix="m").push()
    _write(dst, {"stray/file": b"x", "head/journal.jsonl": b"stale"})
    result = TreeMirror(dst, s3_store, prefix="m").pull()
    assert _tree(dst) == RUN
    assert "stray/file" in result.removed and "head/journal.jsonl" in result.downloaded


def test_pull_from_an_empty_or_wrong_prefix_refuses_to_wipe_the_local_copy(tmp_path, s3_store):
    local = tmp_path / "copy"
    (local / "sub").mkdir(parents=True)
    (local / "sub" / "weights.bin").write_bytes(b"w" * 10)
    (local / "LATEST").write_bytes(b"sub")
    wrong = TreeMirror(local, s3_store, "no/mirror/here")
    with pytest.raises(MirrorError, match="no mirror was pushed there"):
        wrong.pull()
    assert (local / "sub" / "weights.bin").read_bytes() == b"w" * 10
    # Forced, the local copy becomes the (empty) remote tree.
    result = wrong.pull(force=True)
    assert set(result.removed) == {"sub/weights.bin", "LATEST"}
    assert not (local / "sub" / "weights.bin").exists()
