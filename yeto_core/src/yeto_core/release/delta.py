"""Delta policy releases: the format, the checks, and the seam to the codec (stdlib only).

A release is stored **full** (every file of the export) or as a **delta**
against a named parent release: the small files (``config.json``, the
tokenizer) whole, and each ``*.safetensors`` file of the export as one
*payload* file that turns the parent's file into the result's, tensor by
tensor. ``docs/releases.md`` describes the format so another tool can read it.

This module owns what both sides must agree on and what proves a result:

* :func:`read_index` parses a safetensors file's header (8-byte little-endian
  length, JSON) without any third-party code;
* :func:`tensor_checksums` hashes every tensor's bytes (``blake2b``, 16 bytes);
* :func:`build_delta` writes a delta directory from two exports with a codec
  and returns the manifest's ``delta`` section (the parent's and the result's
  checksum per tensor, the payload's layout);
* :func:`apply_delta` rebuilds the result from the parent's local copy, checks
  the parent's checksums before (a wrong parent is refused), every tensor's
  checksum after, and every file's sha256 against the full export's digests
  recorded in the manifest (``result_files``): the applied result is the full
  export, bit for bit, or a :class:`DeltaError`.

The **codec** (:class:`DeltaCodec`) only turns bytes into payload chunks and
back; it is registered by a plugin (``yeto_release_codecs``; ``yeto-torch``
ships ``numpy-zstd``) so the core needs no compression library.
"""

from __future__ import annotations

import abc
import hashlib
import json
import math
import os
import shutil
import struct
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

from yeto_core.errors import ReleaseError
from yeto_core.records import ShardDigest
from yeto_core.stores.manifest import digest_dir

#: The ``format`` of a delta section this module reads and writes.
FORMAT = "yeto-delta/1"
#: Suffix of a payload file: ``model.safetensors`` -> ``model.safetensors.delta``.
PAYLOAD_SUFFIX = ".delta"
#: Tensor encodings a payload chunk may use (the codec picks per tensor).
ENCODINGS = ("same", "sparse", "xor", "diff", "raw")
#: ``[releases] deltas = "auto"``: deltas when the export's weights are at least this big.
AUTO_MIN_BYTES = 64 * 1024 * 1024
#: ``[releases] full_every``: a full release at least every this many releases.
FULL_EVERY = 8
MODES = ("auto", "on", "off")


class DeltaError(ReleaseError):
    """A delta cannot be applied or its result fails a check; ``reason`` names which.

    Reasons: ``parent_mismatch`` (the local parent is not the delta's parent),
    ``tensor_checksum_mismatch``, ``result_digest_mismatch``, ``chain_broken``,
    ``no_codec``, ``malformed``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class DeltaCodec(abc.ABC):
    """Encodes one tensor's change into a payload chunk and applies it back.

    ``NAME`` is recorded in every delta (``delta.codec``); a follower needs a codec
    of that name. Bytes in, bytes out: the core does every check.
    """

    NAME: str = ""

    @abc.abstractmethod
    def encode(
        self, parent: memoryview, result: memoryview, itemsize: int, dtype: Optional[str] = None
    ) -> tuple[str, bytes]:
        """The smallest chunk that turns ``parent`` into ``result`` (same length).

        :param itemsize: bytes per element (2 for bf16): sparse indices count elements.
        :param dtype: the safetensors dtype (``"BF16"``): a hint for the encoding; the
            chunk alone must be enough to apply it.
        :returns: ``(encoding, chunk)`` with ``encoding`` in :data:`ENCODINGS`.
        """

    @abc.abstractmethod
    def encode_raw(self, result: memoryview) -> bytes:
        """A ``raw`` chunk: ``result`` compressed (a tensor the parent lacks)."""

    @abc.abstractmethod
    def apply(
        self, encoding: str, parent: Optional[memoryview], chunk: bytes, size: int, itemsize: int
    ) -> bytes:
        """The result's bytes (``size`` of them) from the parent's bytes and a chunk."""


# -- safetensors, read with the stdlib ---------------------------------------------------

_ITEMSIZE = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


def read_index(path: str | os.PathLike[str]) -> tuple[bytes, dict[str, dict[str, Any]]]:
    """The header bytes (length prefix included) and ``{tensor: {dtype, shape, start, end}}``.

    ``start``/``end`` are absolute byte offsets in the file.
    """
    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise DeltaError("malformed", f"{p} is not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        raw = f.read(n)
    if len(raw) != n:
        raise DeltaError("malformed", f"{p}: safetensors header of {n} bytes is cut short")
    try:
        return head + raw, _tensor_index(raw, 8 + n)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DeltaError(
            "malformed", f"{p}: safetensors header does not parse ({type(exc).__name__}: {exc})"
        ) from None


def _tensor_index(raw: bytes, base: int) -> dict[str, dict[str, Any]]:
    """``{tensor: {dtype, shape, start, end}}`` of a safetensors header's JSON ``raw`` whose
    data starts at ``base`` (raises ValueError/TypeError/KeyError on a malformed one)."""
    out = {}
    for name, meta in json.loads(raw).items():
        if name == "__metadata__":
            continue
        a, b = (int(x) for x in meta["data_offsets"])
        out[name] = {
            "dtype": str(meta["dtype"]),
            "shape": [int(x) for x in meta["shape"]],
            "start": base + a,
            "end": base + b,
        }
    return out


def _checksum(data: memoryview) -> str:
    return "blake2b:" + hashlib.blake2b(data, digest_size=16).hexdigest()


def _mapped(path: Path) -> tuple[None, memoryview]:
    return None, memoryview(Path(path).read_bytes())


def tensor_checksums(path: str | os.PathLike[str]) -> dict[str, str]:
    """``{tensor: "blake2b:<32 hex>"}`` over each tensor's bytes in a safetensors file."""
    _, index = read_index(path)
    _, view = _mapped(Path(path))
    return {n: _checksum(view[t["start"] : t["end"]]) for n, t in sorted(index.items())}


def weight_files(local_dir: Path) -> list[str]:
    """The ``*.safetensors`` files at the top of an export, sorted."""
    return sorted(p.name for p in Path(local_dir).glob("*.safetensors") if p.is_file())


def weights_bytes(local_dir: str | os.PathLike[str]) -> int:
    """Bytes of an export's ``*.safetensors`` files (what ``deltas = "auto"`` compares)."""
    return sum((Path(local_dir) / n).stat().st_size for n in weight_files(Path(local_dir)))


# -- writing -----------------------------------------------------------------------------


def build_delta(
    codec: DeltaCodec, parent_dir: Path, result_dir: Path, out_dir: Path
) -> dict[str, Any]:
    """Write into ``out_dir`` a delta turning ``parent_dir``'s export into ``result_dir``'s.

    Files other than ``*.safetensors`` are copied whole. :returns: the ``files`` part of
    the manifest's ``delta`` section (per weight file: payload name, header chunk, and
    per tensor encoding, chunk offset/length and the parent's and result's checksums).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = set(weight_files(result_dir))
    for p in sorted(Path(result_dir).rglob("*")):
        if p.is_file() and p.relative_to(result_dir).as_posix() not in weights:
            dst = out_dir / p.relative_to(result_dir)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, dst)
    files: dict[str, Any] = {}
    for name in sorted(weights):
        files[name] = _delta_file(codec, Path(parent_dir) / name, Path(result_dir) / name, out_dir)
    return files


def workers() -> int:
    """Threads that encode or apply tensors at once (``YETO_DELTA_THREADS``, else the CPUs, <= 8).

    Hashing (``hashlib``), the codec's numpy and zstd work release the GIL on large
    buffers, so tensors are worked on in parallel and written in order.
    """
    env = os.environ.get("YETO_DELTA_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    return max(1, min(8, os.cpu_count() or 1))


def _in_order(fn: Callable[[Any], Any], items: list[Any]) -> Iterator[Any]:
    """``fn`` over ``items`` on :func:`workers` threads, results in order, a bounded window ahead."""
    n = workers()
    if n == 1 or len(items) < 2:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="delta") as pool:
        window: deque[Future[Any]] = deque()
        it = iter(items)
        try:
            for item in it:
                window.append(pool.submit(fn, item))
                if len(window) >= 2 * n:
                    yield window.popleft().result()
            while window:
                yield window.popleft().result()
        finally:
            for f in window:
                f.cancel()


def _delta_file(codec: DeltaCodec, parent: Path, result: Path, out_dir: Path) -> dict[str, Any]:
    r_header, r_index = read_index(result)
    p_index: dict[str, dict[str, Any]] = {}
    pview = memoryview(b"")
    if parent.is_file():
        _, p_index = read_index(parent)
        _, pview = _mapped(parent)
    _, rview = _mapped(result)
    payload_name = result.name + PAYLOAD_SUFFIX
    tensors: dict[str, Any] = {}

    def encode(name: str) -> tuple[str, dict[str, Any], str, bytes]:
        t = r_index[name]
        rbytes = rview[t["start"] : t["end"]]
        itemsize = _ITEMSIZE.get(t["dtype"], 1)
        pt = p_index.get(name)
        entry: dict[str, Any] = {
            "dtype": t["dtype"],
            "shape": t["shape"],
            "checksum": _checksum(rbytes),
        }
        if pt is not None and pt["dtype"] == t["dtype"] and pt["shape"] == t["shape"]:
            pbytes = pview[pt["start"] : pt["end"]]
            entry["parent_checksum"] = _checksum(pbytes)
            encoding, chunk = codec.encode(pbytes, rbytes, itemsize, dtype=t["dtype"])
        else:
            encoding, chunk = "raw", codec.encode_raw(rbytes)
        if encoding not in ENCODINGS:
            raise DeltaError("malformed", f"codec {codec.NAME!r} chose {encoding!r}")
        return name, entry, encoding, chunk

    with open(out_dir / payload_name, "wb") as out:
        out.write(r_header)  # the result's header, verbatim: offsets and metadata
        pos = len(r_header)
        order = sorted(r_index, key=lambda n: r_index[n]["start"])
        for name, entry, encoding, chunk in _in_order(encode, order):
            out.write(chunk)
            entry.update(encoding=encoding, offset=pos, length=len(chunk))
            pos += len(chunk)
            tensors[name] = entry
    return {"payload": payload_name, "header_length": len(r_header), "tensors": tensors}


# -- reading -----------------------------------------------------------------------------


def apply_delta(
    codec: Optional[DeltaCodec],
    delta: Mapping[str, Any],
    result_files: tuple[ShardDigest, ...],
    parent_dir: Path,
    delta_dir: Path,
    out_dir: Path,
    *,
    release_id: str = "?",
) -> None:
    """Rebuild a release's full export in ``out_dir`` from its parent's and its delta files.

    :param delta: the manifest's ``delta`` section.
    :param result_files: the manifest's digests of the full export (the result must match).
    :raises DeltaError: the parent's tensors do not match the delta's ``parent_checksum``
        (``parent_mismatch``), a rebuilt tensor fails its ``checksum``
        (``tensor_checksum_mismatch``), a file fails its sha256 (``result_digest_mismatch``).
    """
    where = f"delta release {release_id!r} (parent {delta.get('parent')!r})"
    if delta.get("format") != FORMAT:
        raise DeltaError("malformed", f"{where}: format {delta.get('format')!r}, not {FORMAT}")
    if codec is None or codec.NAME != delta.get("codec"):
        raise DeltaError(
            "no_codec",
            f"{where} needs release codec {delta.get('codec')!r}, which no installed plugin "
            "provides (yeto-torch ships numpy-zstd); install it, or set [releases] deltas = "
            '"off" on the trainer',
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    files = dict(delta.get("files") or {})
    for p in sorted(Path(delta_dir).rglob("*")):
        rel = p.relative_to(delta_dir).as_posix()
        if p.is_file() and not any(rel == spec["payload"] for spec in files.values()):
            dst = out_dir / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, dst)
    for name, spec in sorted(files.items()):
        _apply_file(codec, spec, Path(parent_dir) / name, Path(delta_dir), out_dir / name, where)
    got = {d.name: d for d in digest_dir(out_dir)}
    want = {d.name: d for d in result_files}
    bad = [
        n
        for n in sorted(set(got) | set(want))
        if n not in got or n not in want or got[n].sha256 != want[n].sha256
    ]
    if bad:
        raise DeltaError(
            "result_digest_mismatch",
            f"{where}: the rebuilt export differs from the full export in {bad[:5]}; "
            "do not load it",
        )


def _apply_file(
    codec: DeltaCodec, spec: Mapping[str, Any], parent: Path, delta_dir: Path, out: Path, where: str
) -> None:
    tensors = dict(spec["tensors"])
    p_index: dict[str, dict[str, Any]] = {}
    if any(t.get("parent_checksum") for t in tensors.values()):
        if not parent.is_file():
            raise DeltaError("parent_mismatch", f"{where}: the local parent lacks {parent.name}")
        _, p_index = read_index(parent)
    payload = (delta_dir / spec["payload"]).read_bytes()
    header = payload[: int(spec["header_length"])]
    _, pview = _mapped(parent) if p_index else (None, memoryview(b""))
    with open(out, "wb") as f:
        f.write(header)
        r_index = _index_of_header(header, where)

        def rebuild(name: str) -> bytes:
            t = r_index[name]
            e = tensors.get(name)
            if e is None:
                raise DeltaError("malformed", f"{where}: no payload entry for tensor {name}")
            size = t["end"] - t["start"]
            itemsize = _ITEMSIZE.get(t["dtype"], 1)
            if (
                t["dtype"] != e.get("dtype")
                or list(t["shape"]) != list(e.get("shape") or ())
                or size != math.prod(t["shape"]) * itemsize
            ):  # a damaged header: never sized or decoded by what it says
                raise DeltaError(
                    "malformed",
                    f"{where}: the payload's header says tensor {name} is {t['dtype']} "
                    f"{t['shape']} in {size} bytes, the manifest {e.get('dtype')} "
                    f"{e.get('shape')}; the payload is damaged, do not load it",
                )
            pbytes: Optional[memoryview] = None
            if e.get("parent_checksum"):
                pt = p_index.get(name)
                if pt is None:
                    raise DeltaError("parent_mismatch", f"{where}: parent lacks {name}")
                pbytes = pview[pt["start"] : pt["end"]]
                if _checksum(pbytes) != e["parent_checksum"]:
                    raise DeltaError(
                        "parent_mismatch",
                        f"{where}: the local parent's tensor {name} is not the one the delta "
                        "was made against; refusing it (fetch the nearest full release)",
                    )
            chunk = payload[int(e["offset"]) : int(e["offset"]) + int(e["length"])]
            try:
                data = codec.apply(e["encoding"], pbytes, chunk, size, itemsize)
            except DeltaError:
                raise
            except Exception as exc:  # a damaged chunk the codec cannot read: refused alike
                raise DeltaError(
                    "malformed",
                    f"{where}: tensor {name}'s chunk does not apply with codec {codec.NAME!r} "
                    f"({type(exc).__name__}: {exc}); do not load it",
                ) from None
            if len(data) != size or _checksum(memoryview(data)) != e["checksum"]:
                raise DeltaError(
                    "tensor_checksum_mismatch",
                    f"{where}: tensor {name} rebuilt from the delta fails its checksum "
                    f"{e['checksum']}; do not load it",
                )
            return data

        order = sorted(r_index, key=lambda n: r_index[n]["start"])
        for data in _in_order(rebuild, order):  # checked in order: the first failure wins
            f.write(data)


def _index_of_header(header: bytes, where: str) -> dict[str, dict[str, Any]]:
    """``{tensor: {dtype, shape, start, end}}`` of a payload's copy of the result's header.

    :raises DeltaError: ``malformed`` when the header does not parse (a damaged payload).
    """
    try:
        (n,) = struct.unpack("<Q", header[:8])
        if 8 + n != len(header):
            raise ValueError(f"its length prefix says {n} bytes, the manifest {len(header) - 8}")
        return _tensor_index(header[8:], 8 + n)
    except (struct.error, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DeltaError(
            "malformed",
            f"{where}: the payload's copy of the result's safetensors header does not parse "
            f"({type(exc).__name__}: {exc}); the payload is damaged, do not load it",
        ) from None
