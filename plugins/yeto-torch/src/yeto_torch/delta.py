"""The ``numpy-zstd`` release codec: per-tensor sparse or XOR chunks, zstd-compressed.

For each tensor the codec writes whichever is smaller:

* ``sparse``: the changed elements, as a little-endian ``uint64`` count ``n``,
  ``n`` ``uint32`` index gaps (the first index, then the distance to the previous
  one; ``uint64`` gaps when the tensor has 2**32 elements or more, flagged by the
  count's top bit) and the ``n`` new element values, all zstd-compressed;
* ``xor``: the bytes of ``parent XOR result`` split into byte planes (all first
  bytes of the elements, then all second bytes, ...; for bf16 the high plane of
  a small update is nearly all zeros), zstd-compressed;

``same`` (nothing changed) is an empty chunk and ``raw`` (a tensor the parent
lacks) the result's bytes compressed. docs/releases.md has the byte layout. The
core (:mod:`yeto_core.release_delta`) checks every tensor's checksum; this
module only moves bytes.
"""

from __future__ import annotations

import struct
from typing import Optional

import numpy as np
import zstandard

from yeto_core.release_delta import DeltaCodec, DeltaError

_UINT = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
_GAP32, _GAP64 = np.dtype("<u4"), np.dtype("<u8")
_WIDE = 1 << 63
LEVEL = 3


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

    def encode(self, parent: memoryview, result: memoryview, itemsize: int) -> tuple[str, bytes]:
        if len(parent) != len(result):
            return "raw", self.encode_raw(result)
        p = self._view(parent, itemsize)
        r = self._view(result, itemsize)
        changed = np.flatnonzero(p != r)
        n = int(changed.size)
        if n == 0:
            return "same", b""
        xor = self._z(_planes(_xor(parent, result), itemsize))
        wide = r.size >= 2**32
        per = (8 if wide else 4) + r.itemsize
        if n * per >= len(xor):  # even uncompressed indices+values cannot beat the XOR
            return "xor", xor
        gaps = np.empty(n, dtype=_GAP64 if wide else _GAP32)
        gaps[0] = changed[0]
        gaps[1:] = np.diff(changed)
        body = struct.pack("<Q", n | (_WIDE if wide else 0)) + gaps.tobytes() + r[changed].tobytes()
        sparse = self._z(body)
        return ("sparse", sparse) if len(sparse) < len(xor) else ("xor", xor)

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
