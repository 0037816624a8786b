"""The numpy-zstd codec per tensor, and the core's checks around any codec."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save_file

from yeto_core.manifest import digest_dir
from yeto_core.release_delta import DeltaError, apply_delta, build_delta, tensor_checksums
from yeto_torch.delta import NumpyZstdCodec


def _pair(changed: int, n: int = 50_000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``changed`` elements of ``n`` given new random values (the sparse case's shape)."""
    rng = np.random.default_rng(seed)
    p = rng.integers(0, 2**16, n, dtype=np.uint16)
    r = p.copy()
    at = rng.choice(n, changed, replace=False)
    r[at] = p[at] ^ rng.integers(1, 2**16, changed, dtype=np.uint16)
    return p, r


@pytest.mark.parametrize(("changed", "encoding"), [(0, "same"), (500, "sparse"), (45_000, "xor")])
def test_each_encoding_round_trips_bitwise(changed, encoding):
    codec = NumpyZstdCodec()
    p, r = _pair(changed)
    enc, chunk = codec.encode(memoryview(p.tobytes()), memoryview(r.tobytes()), 2)
    assert enc == encoding
    back = codec.apply(enc, memoryview(p.tobytes()), chunk, r.nbytes, 2)
    assert back == r.tobytes()
    if enc == "sparse":  # about the indices and values, not the tensor
        assert len(chunk) < 500 * 6


def test_raw_for_a_tensor_of_another_shape():
    codec = NumpyZstdCodec()
    r = np.arange(1000, dtype=np.uint16)
    enc, chunk = codec.encode(memoryview(b"\0" * 10), memoryview(r.tobytes()), 2)
    assert enc == "raw" and codec.apply(enc, None, chunk, r.nbytes, 2) == r.tobytes()


class Liar(NumpyZstdCodec):
    """A codec whose apply returns one wrong byte: only the core's checksum can see it."""

    def apply(self, encoding, parent, chunk, size, itemsize):
        out = bytearray(super().apply(encoding, parent, chunk, size, itemsize))
        out[len(out) // 2] ^= 1
        return bytes(out)


def _export(d, tensors):
    d.mkdir(parents=True)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text("{}\n")
    return d


def test_core_checks_every_rebuilt_tensor_and_the_parent(tmp_path):
    p, r = _pair(500)
    parent = _export(tmp_path / "p", {"w": p.view(np.float16), "b": np.ones(3, np.float32)})
    result = _export(tmp_path / "r", {"w": r.view(np.float16), "b": np.ones(3, np.float32)})
    spec = build_delta(NumpyZstdCodec(), parent, result, tmp_path / "d")
    tensors = spec["model.safetensors"]["tensors"]
    assert tensors["b"]["encoding"] == "same" and tensors["w"]["encoding"] == "sparse"
    assert tensors["w"]["checksum"] == tensor_checksums(result / "model.safetensors")["w"]
    delta = {"format": "yeto-delta/1", "codec": "numpy-zstd", "parent": "1", "files": spec}
    want = digest_dir(result)
    apply_delta(NumpyZstdCodec(), delta, want, parent, tmp_path / "d", tmp_path / "ok")
    assert (tmp_path / "ok" / "model.safetensors").read_bytes() == (
        result / "model.safetensors"
    ).read_bytes()
    with pytest.raises(DeltaError) as err:
        apply_delta(Liar(), delta, want, parent, tmp_path / "d", tmp_path / "bad")
    assert err.value.reason == "tensor_checksum_mismatch"
    with pytest.raises(DeltaError) as err:  # the result as parent: not what it was made against
        apply_delta(NumpyZstdCodec(), delta, want, result, tmp_path / "d", tmp_path / "bad2")
    assert err.value.reason == "parent_mismatch"
    with pytest.raises(DeltaError) as err:
        apply_delta(None, delta, want, parent, tmp_path / "d", tmp_path / "bad3")
    assert err.value.reason == "no_codec"
