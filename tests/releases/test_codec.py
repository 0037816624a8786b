"""The numpy-zstd codec per tensor, and the core's checks around any codec."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save_file

from yeto_core.release.delta import DeltaError, apply_delta, build_delta, tensor_checksums
from yeto_core.stores.manifest import digest_dir
from yeto_torch.delta import NumpyZstdCodec


def _pair(changed: int, n: int = 50_000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``changed`` elements of ``n`` given new random values (the sparse case's shape)."""
    rng = np.random.default_rng(seed)
    p = rng.integers(0, 2**16, n, dtype=np.uint16)
    r = p.copy()
    at = rng.choice(n, changed, replace=False)
    r[at] = p[at] ^ rng.integers(1, 2**16, changed, dtype=np.uint16)
    return p, r


@pytest.mark.parametrize(("changed", "encoding"), [(0, "same"), (500, "sparse"), (45_000, "diff")])
def test_each_encoding_round_trips_bitwise(changed, encoding):
    codec = NumpyZstdCodec()
    p, r = _pair(changed)
    enc, chunk = codec.encode(memoryview(p.tobytes()), memoryview(r.tobytes()), 2)
    assert enc == encoding
    back = codec.apply(enc, memoryview(p.tobytes()), chunk, r.nbytes, 2)
    assert back == r.tobytes()
    if enc == "sparse":  # about the indices and values, not the tensor
        assert len(chunk) < 500 * 6


def test_xor_for_eight_byte_elements_round_trips():
    codec = NumpyZstdCodec()
    rng = np.random.default_rng(1)
    p = rng.standard_normal(20_000)
    r = p + rng.standard_normal(20_000) * 1e-9
    enc, chunk = codec.encode(memoryview(p.tobytes()), memoryview(r.tobytes()), 8, dtype="F64")
    assert enc == "xor"
    assert codec.apply(enc, memoryview(p.tobytes()), chunk, r.nbytes, 8) == r.tobytes()


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even), as uint16."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _adam_like(n: int, lr: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """bf16 weights of scale 0.02 before and after every master moved by +-lr."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(n) * 0.02).astype(np.float32)
    return _bf16(w), _bf16(w + lr * np.sign(rng.standard_normal(n)).astype(np.float32))


@pytest.mark.parametrize("dtype", ["BF16", "F16", None])
def test_diff_round_trips_every_bit_pattern_bitwise(dtype):
    """Sign crossings, +-0, infinities, NaNs, subnormals, wrap-around: all bit-exact."""
    codec = NumpyZstdCodec()
    rng = np.random.default_rng(2)
    special = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x7F80, 0xFF80, 0x7FC1, 0xFFFF, 0x7FFF])
    p = np.concatenate([rng.integers(0, 2**16, 60_000), special, special]).astype(np.uint16)
    r = p.copy()
    r[:30_000] += rng.integers(-3, 4, 30_000).astype(np.uint16)  # small moves, wrapping
    r[-len(special) :] = special[::-1]  # each special value into another
    r[-2 * len(special) : -len(special)] ^= 0x8000  # sign flips
    enc, chunk = codec.encode(memoryview(p.tobytes()), memoryview(r.tobytes()), 2, dtype=dtype)
    assert enc == "diff"
    assert codec.apply(enc, memoryview(p.tobytes()), chunk, r.nbytes, 2) == r.tobytes()


def test_diff_round_trips_float32_bitwise():
    codec = NumpyZstdCodec()
    rng = np.random.default_rng(3)
    p = (rng.standard_normal(40_000) * 0.02).astype(np.float32)
    r = (p - np.float32(1e-4) * np.sign(rng.standard_normal(40_000))).astype(np.float32)
    r[:5] = [0.0, -0.0, np.inf, -np.inf, np.nan]
    enc, chunk = codec.encode(memoryview(p.tobytes()), memoryview(r.tobytes()), 4, dtype="F32")
    assert enc == "diff" and chunk[0] == 3  # grouped by the float32 exponent
    assert codec.apply(enc, memoryview(p.tobytes()), chunk, r.nbytes, 4) == r.tobytes()


def test_a_bf16_step_of_a_few_ulps_costs_far_less_than_its_xor():
    """An AdamW-like step at lr 2e-4 on bf16 weights of scale 0.02 (most elements move
    1-10 units in the last place): the ordered difference, grouped by the parent's
    exponent, is smaller than the byte-plane XOR the codec wrote before."""
    from yeto_torch.delta import _planes, _xor

    codec = NumpyZstdCodec()
    p, r = _adam_like(200_000, 2e-4)
    enc, chunk = codec.encode(memoryview(p.tobytes()), memoryview(r.tobytes()), 2, dtype="BF16")
    xor = codec._z(_planes(_xor(p.tobytes(), r.tobytes()), 2))
    assert enc == "diff" and chunk[0] == 1
    assert len(chunk) < 0.8 * len(xor), (len(chunk), len(xor), r.nbytes)
    assert codec.apply(enc, memoryview(p.tobytes()), chunk, r.nbytes, 2) == r.tobytes()


def test_a_diff_chunk_with_a_flipped_byte_never_yields_the_result():
    codec = NumpyZstdCodec()
    p, r = _adam_like(50_000, 2e-4, seed=4)
    _, chunk = codec.encode(memoryview(p.tobytes()), memoryview(r.tobytes()), 2, dtype="BF16")
    bad = bytearray(chunk)
    bad[len(bad) // 2] ^= 0x10
    try:
        out = codec.apply("diff", memoryview(p.tobytes()), bytes(bad), r.nbytes, 2)
    except DeltaError:
        return  # zstd's frame check caught it
    assert out != r.tobytes()  # else the core's per-tensor checksum refuses it


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


@pytest.mark.parametrize("threads", ["1", "4"])
def test_tensors_worked_on_in_parallel_are_written_and_checked_in_order(
    tmp_path, monkeypatch, threads
):
    """Many tensors on several threads: the rebuilt file is the result byte for byte, and a
    damaged parent tensor in the middle is named (the first failing tensor in file order)."""
    monkeypatch.setenv("YETO_DELTA_THREADS", threads)
    ps, rs = {}, {}
    for i in range(9):
        p, r = _adam_like(3_000 + 500 * i, 2e-4, seed=10 + i)
        ps[f"t{i}"], rs[f"t{i}"] = p.view(np.float16), r.view(np.float16)
    parent = _export(tmp_path / "p", ps)
    result = _export(tmp_path / "r", rs)
    spec = build_delta(NumpyZstdCodec(), parent, result, tmp_path / "d")
    delta = {"format": "yeto-delta/1", "codec": "numpy-zstd", "parent": "1", "files": spec}
    want = digest_dir(result)
    apply_delta(NumpyZstdCodec(), delta, want, parent, tmp_path / "d", tmp_path / "ok")
    assert (tmp_path / "ok" / "model.safetensors").read_bytes() == (
        result / "model.safetensors"
    ).read_bytes()
    ps["t4"] = ps["t4"].copy()
    ps["t4"][7] = ps["t4"][8]
    damaged = _export(tmp_path / "p2", ps)
    with pytest.raises(DeltaError) as err:
        apply_delta(NumpyZstdCodec(), delta, want, damaged, tmp_path / "d", tmp_path / "bad")
    assert err.value.reason == "parent_mismatch" and "tensor t4 " in str(err.value)


def test_any_flipped_byte_of_a_payload_is_a_delta_error(tmp_path):
    """A payload damaged anywhere (its copy of the result's header too: a file digest made
    to agree with it, or a store that returns what it was given) is refused with a
    :class:`DeltaError`, never another exception and never a result (found by the fuzz)."""
    p, r = _pair(20, n=64)
    parent = _export(tmp_path / "p", {"w": p.view(np.float16), "b": np.ones(3, np.float32)})
    result = _export(tmp_path / "r", {"w": r.view(np.float16), "b": np.zeros(3, np.float32)})
    spec = build_delta(NumpyZstdCodec(), parent, result, tmp_path / "d")
    delta = {"format": "yeto-delta/1", "codec": "numpy-zstd", "parent": "1", "files": spec}
    want = digest_dir(result)
    payload = tmp_path / "d" / spec["model.safetensors"]["payload"]
    good = payload.read_bytes()
    reasons = set()
    for at in range(len(good)):
        bad = bytearray(good)
        bad[at] ^= 1 << (at % 8)
        payload.write_bytes(bytes(bad))
        with pytest.raises(DeltaError) as err:
            apply_delta(NumpyZstdCodec(), delta, want, parent, tmp_path / "d", tmp_path / "out")
        reasons.add(err.value.reason)
    assert reasons <= {"malformed", "tensor_checksum_mismatch", "result_digest_mismatch"}
    assert "malformed" in reasons  # the header's JSON broken by a flip
