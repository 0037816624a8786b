"""The ``numpy-zstd`` release codec: per-tensor sparse or XOR chunks, zstd-compressed.

For each tensor the codec writes whichever is smaller:

* ``diff``: for float tensors (2 or 4 bytes per element), the difference of each
  element's bit pattern read as an *ordered* integer (sign-magnitude mapped to a
  monotone unsigned integer, so a move of one unit in the last place is +-1),
  zigzag-coded (small magnitudes give small unsigned numbers), the elements
  grouped by the **parent's** exponent (a stable sort the reader repeats from its
  own copy of the parent: the elements of one exponent move by similar numbers of
  units in the last place), split into byte planes, zstd-compressed;
* ``sparse``: the changed elements, as a little-endian ``uint64`` count ``n``,
  ``n`` ``uint32`` index gaps (the first index, then the distance to the previous
  one; ``uint64`` gaps when the tensor has 2**32 elements or more, flagged by the
  count's top bit) and the ``n`` new element values, all zstd-compressed;
* ``xor`` (for other element sizes, and read for releases written before
  ``diff``): the bytes of ``parent XOR result`` split into byte planes (all first
  bytes of the elements, then all second bytes, ...), zstd-compressed;

``same`` (nothing changed) is an empty chunk and ``raw`` (a tensor the parent
lacks) the result's bytes compressed. docs/releases.md has the byte layout. The
core (:mod:`yeto_core.release.delta`) checks every tensor's checksum; this
module only moves bytes.
"""

from __future__ import annotations

import struct
from typing import Optional

import numpy as np
import zstandard

from yeto_core.release.delta import DeltaCodec, DeltaError

_UINT = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
_GAP32, _GAP64 = np.dtype("<u4"), np.dtype("<u8")
_WIDE = 1 << 63
LEVEL = 1  # on these byte planes level 1 is both smaller and faster than 3 (measured)
#: ``diff`` chunks: the first byte says how the elements were grouped before the planes
#: (by which bits of the parent's element: its exponent, per dtype); 0 is no grouping.
GROUP_NONE, GROUP_BF16, GROUP_F16, GROUP_F32 = 0, 1, 2, 3
_GROUP_OF_DTYPE = {"BF16": GROUP_BF16, "F16": GROUP_F16, "F32": GROUP_F32}
#: group tag -> (element bytes, shift, mask) of the parent's exponent field
_GROUP_FIELD = {GROUP_BF16: (2, 7, 0xFF), GROUP_F16: (2, 10, 0x1F), GROUP_F32: (4, 23, 0xFF)}


class NumpyZstdCodec(DeltaCodec):
    """Sparse-or-XOR chunks compressed with zstd (see the module docstring)."""

    NAME = "numpy-zstd"

    def __init__(self, level: int = LEVEL) -> None:
        self.level = int(level)

    def _z(self, data: bytes | memoryview) -> bytes:
        return zstandard.ZstdCompressor(level=self.level).compress(data)

    @staticmethod
    def _unz(chunk: bytes) -> bytes:
        try:
            return zstandard.ZstdDecompressor().decompress(chunk)
        except zstandard.ZstdError as exc:
            raise DeltaError(
                "tensor_checksum_mismatch", f"a delta chunk does not decompress: {exc}"
            ) from None

    @staticmethod
    def _view(data: memoryview | bytes, itemsize: int) -> np.ndarray:
        dt = _UINT.get(itemsize, _UINT[1])
        return np.frombuffer(data, dtype=dt)

    def encode(
        self, parent: memoryview, result: memoryview, itemsize: int, dtype: Optional[str] = None
    ) -> tuple[str, bytes]:
        if len(parent) != len(result):
            return "raw", self.encode_raw(result)
        p = self._view(parent, itemsize)
        r = self._view(result, itemsize)
        ne = p != r
        n = int(np.count_nonzero(ne))
        if n == 0:
            return "same", b""
        if itemsize in (2, 4):
            best = ("diff", self._encode_diff(p, r, _GROUP_OF_DTYPE.get(dtype or "", GROUP_NONE)))
        else:
            best = ("xor", self._z(_planes(_xor(parent, result), itemsize)))
        wide = r.size >= 2**32
        if n * (r.itemsize + 1) >= len(best[1]):  # the values and a byte per index: no gain
            return best
        changed = np.flatnonzero(ne)
        gaps = np.empty(n, dtype=_GAP64 if wide else _GAP32)
        gaps[0] = changed[0]
        gaps[1:] = np.diff(changed)
        body = struct.pack("<Q", n | (_WIDE if wide else 0)) + gaps.tobytes() + r[changed].tobytes()
        sparse = self._z(body)
        return ("sparse", sparse) if len(sparse) < len(best[1]) else best

    def _encode_diff(self, p: np.ndarray, r: np.ndarray, group: int) -> bytes:
        if group != GROUP_NONE and _GROUP_FIELD[group][0] != p.itemsize:
            group = GROUP_NONE
        zz = _zigzag(_ordered(r) - _ordered(p))  # unsigned arithmetic: wraps, invertible
        if group != GROUP_NONE:
            zz = zz[_group_order(p, group)]
        return bytes([group]) + self._z(_planes(zz.tobytes(), p.itemsize))

    def encode_raw(self, result: memoryview) -> bytes:
        return self._z(result)

    def apply(
        self, encoding: str, parent: Optional[memoryview], chunk: bytes, size: int, itemsize: int
    ) -> bytes:
        if encoding == "raw":
            return self._unz(chunk)
        if parent is None:
            raise DeltaError("malformed", f"a {encoding!r} chunk needs the parent's tensor")
        if encoding == "same":
            return bytes(parent)
        if encoding == "diff":
            return self._apply_diff(parent, chunk, itemsize)
        if encoding == "xor":
            x = self._unz(chunk)
            if len(x) != len(parent):
                raise DeltaError(
                    "tensor_checksum_mismatch",
                    f"an xor chunk holds {len(x)} bytes, the parent's tensor {len(parent)}",
                )
            return _xor(parent, _unplanes(x, itemsize))
        if encoding == "sparse":
            body = self._unz(chunk)
            (head,) = struct.unpack_from("<Q", body)
            wide = bool(head & _WIDE)
            n = head & ~_WIDE
            gw = 8 if wide else 4
            out = self._view(parent, itemsize).copy()
            need = 8 + n * gw + n * out.itemsize
            if len(body) != need:
                raise DeltaError(
                    "tensor_checksum_mismatch",
                    f"a sparse chunk holds {len(body)} bytes, its count says {need}",
                )
            gaps = np.frombuffer(body, dtype=_GAP64 if wide else _GAP32, count=n, offset=8)
            idx = np.cumsum(gaps, dtype=np.uint64)
            if n and int(idx[-1]) >= out.size:
                raise DeltaError(
                    "tensor_checksum_mismatch", "a sparse chunk indexes past its tensor"
                )
            out[idx] = np.frombuffer(body, dtype=out.dtype, count=n, offset=8 + n * gw)
            return out.tobytes()
        raise DeltaError("malformed", f"unknown chunk encoding {encoding!r}")

    def _apply_diff(self, parent: memoryview, chunk: bytes, itemsize: int) -> bytes:
        if itemsize not in (2, 4) or not chunk:
            raise DeltaError("malformed", f"a diff chunk for {itemsize}-byte elements")
        group = chunk[0]
        if group != GROUP_NONE and (
            group not in _GROUP_FIELD or _GROUP_FIELD[group][0] != itemsize
        ):
            raise DeltaError("malformed", f"a diff chunk groups by unknown field {group}")
        zz_bytes = _unplanes(self._unz(chunk[1:]), itemsize)
        if len(zz_bytes) != len(parent):
            raise DeltaError(
                "tensor_checksum_mismatch",
                f"a diff chunk holds {len(zz_bytes)} bytes, the parent's tensor {len(parent)}",
            )
        p = self._view(parent, itemsize)
        zz = np.frombuffer(zz_bytes, dtype=p.dtype)
        if group != GROUP_NONE:
            ungrouped = np.empty_like(zz)
            ungrouped[_group_order(p, group)] = zz
            zz = ungrouped
        return _unordered(_ordered(p) + _unzigzag(zz)).tobytes()


_SIGNED = {2: np.dtype("<i2"), 4: np.dtype("<i4")}


def _all_ones_if_negative(a: np.ndarray) -> np.ndarray:
    """Per element: all bits set where the top bit is set, else 0 (an arithmetic shift)."""
    bits = 8 * a.dtype.itemsize
    return (a.view(_SIGNED[a.dtype.itemsize]) >> (bits - 1)).view(a.dtype)


def _ordered(a: np.ndarray) -> np.ndarray:
    """Sign-magnitude bit patterns as monotone unsigned integers (-0 and +0 adjacent).

    Positive patterns get the top bit set (``a | sign``), negative ones are inverted
    (``~a``): ``a ^ (sign | all-ones-if-negative)``.
    """
    sign = a.dtype.type(1 << (8 * a.dtype.itemsize - 1))
    return a ^ (_all_ones_if_negative(a) | sign)


def _unordered(k: np.ndarray) -> np.ndarray:
    sign = k.dtype.type(1 << (8 * k.dtype.itemsize - 1))
    return k ^ (_all_ones_if_negative(~k) | sign)


def _zigzag(d: np.ndarray) -> np.ndarray:
    """Unsigned words read as two's complement -> 0, -1, 1, -2, ... as 0, 1, 2, 3, ..."""
    return (d << d.dtype.type(1)) ^ _all_ones_if_negative(d)


def _unzigzag(z: np.ndarray) -> np.ndarray:
    return (z >> z.dtype.type(1)) ^ (z.dtype.type(0) - (z & z.dtype.type(1)))


def _group_order(p: np.ndarray, group: int) -> np.ndarray:
    """The stable order of the elements by the parent's exponent field."""
    _, shift, mask = _GROUP_FIELD[group]
    key = ((p >> p.dtype.type(shift)) & p.dtype.type(mask)).astype(np.uint8)
    return np.argsort(key, kind="stable")


def _xor(a: memoryview | bytes, b: memoryview | bytes) -> bytes:
    n = len(a)
    if n % 8 == 0:
        dt = np.uint64
    elif n % 4 == 0:
        dt = np.uint32
    elif n % 2 == 0:
        dt = np.uint16
    else:
        dt = np.uint8
    return np.bitwise_xor(np.frombuffer(a, dtype=dt), np.frombuffer(b, dtype=dt)).tobytes()


def _planes(data: bytes, itemsize: int) -> bytes:
    """Element bytes regrouped by position: byte 0 of every element, then byte 1, ..."""
    if itemsize not in (2, 4, 8) or len(data) % itemsize:
        return data
    a = np.frombuffer(data, _UINT[itemsize])
    out = np.empty((itemsize, a.size), np.uint8)
    for i in range(itemsize):
        out[i] = a >> np.array(8 * i, a.dtype)  # the low byte of each shifted element
    return out.tobytes()


def _unplanes(data: bytes, itemsize: int) -> bytes:
    if itemsize not in (2, 4, 8) or len(data) % itemsize:
        return data
    planes = np.frombuffer(data, np.uint8).reshape(itemsize, -1)
    dt = _UINT[itemsize]
    out = planes[0].astype(dt)
    for i in range(1, itemsize):
        out |= planes[i].astype(dt) << np.array(8 * i, dt)
    return out.tobytes()
