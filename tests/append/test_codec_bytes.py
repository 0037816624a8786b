"""The payload and index-record bytes are pinned: a faster encoder must write the same
bytes (the on-disk format, and a batch appended again after a crash names the same pack)."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest

from yeto_core.buffer.group_codec import decode_group, encode_group
from yeto_core.buffer.sample_buffer.codec import decode_record, encode_record
from yeto_core.records import Sample, SampleGroup, SampleStatus, SamplingParams


def _large() -> SampleGroup:
    out = []
    for k in range(8):
        out.append(
            Sample(
                tokens=(np.arange(1024, dtype=np.int32) * 7919 + k) % 150_000,
                prompt_len=256,
                logprobs=np.linspace(-3.0, 0.0, 768, dtype=np.float32) + k,
                loss_mask=np.ones(768, dtype=np.uint8),
                reward=float(k % 2),
                weight_version=3,
            )
        )
    return SampleGroup("bench-00000007", "p7", "bench", 0, tuple(out), task="bench")


def _mixed() -> SampleGroup:
    s0 = Sample(
        tokens=[5, 6, 7, 8],  # plain lists and other dtypes are converted
        prompt_len=1,
        logprobs=[-0.1, -0.2, -0.3],
        loss_mask=[True, False, True],
        reward=math.nan,
        weight_version=7,
        status=SampleStatus.TRUNCATED,
        routed_experts=np.arange(24, dtype=np.int64).reshape(3, 2, 4),
    )
    s1 = Sample(
        tokens=np.array([1, 2], dtype=np.int64),
        prompt_len=2,
        logprobs=np.zeros(0, np.float64),
        loss_mask=np.zeros(0, np.uint8),
        reward=math.inf,
        weight_version=9,
    )
    s2 = Sample(
        tokens=np.arange(10, dtype=np.int32)[::2],  # not contiguous
        prompt_len=2,
        logprobs=np.linspace(-1, 0, 3),
        loss_mask=np.ones(3, np.uint8),
        reward=-1.5,
        weight_version=2**40,
        routed_experts=np.ones((4, 2, 4), np.int32),
    )
    sp = SamplingParams(temperature=0.7, top_k=20, top_p=0.95)
    return SampleGroup("g-1", "p\u00e9", "host-a", 4, (s0, s1, s2), task="gsm8k", sampling=sp)


def _one() -> SampleGroup:
    s = Sample(
        tokens=np.array([1, 2], dtype=np.int64),
        prompt_len=2,
        logprobs=np.zeros(0, np.float64),
        loss_mask=np.zeros(0, np.uint8),
        reward=math.inf,
        weight_version=9,
    )
    return SampleGroup("g-2", "p", "h", 0, (s,))


# sha256 of the bytes that the encoder wrote before it was made faster (the same format)
PINNED = {
    "large": "93fc8babced01b55739e116ca9cadb98151bdc0c64af035e0bd911553e65faa0",
    "mixed": "840cb690896da0621ac022a0184548631c4d5d1d7dfc1cab5d4e3e7b5eafb46f",
    "one": "3eb807550b35c38e47bbfde4c4a76c53a5df07196d999176e8381a306a571cda",
}


@pytest.mark.parametrize("name,build", [("large", _large), ("mixed", _mixed), ("one", _one)])
def test_encode_group_writes_the_pinned_bytes(name, build):
    data = encode_group(build())
    assert isinstance(data, bytes)
    assert hashlib.sha256(data).hexdigest() == PINNED[name]
    back = decode_group(data)
    assert back.group_id == build().group_id


def test_mixed_group_round_trips_after_conversion():
    g = _mixed()
    back = decode_group(encode_group(g))
    for a, b in zip(g.samples, back.samples, strict=True):
        np.testing.assert_array_equal(np.asarray(a.tokens, np.int32), b.tokens)
        np.testing.assert_array_equal(np.asarray(a.logprobs, np.float32), b.logprobs)
        np.testing.assert_array_equal(np.asarray(a.loss_mask, np.uint8), b.loss_mask)
        if a.routed_experts is None:
            assert b.routed_experts is None
        else:
            np.testing.assert_array_equal(a.routed_experts, b.routed_experts)


RECORD = {
    "position": 3,
    "group_id": "g",
    "prompt_id": 'p\u00e9"',
    "host": "h",
    "incarnation": 1,
    "n_samples": 2,
    "min_version": 0,
    "max_version": 1,
    "appended_at": 1712345678.123456,
    "payload": "buffer/groups/g.safetensors",
    "seq": -1,
    "digest": "ab" * 32,
    "offset": 0,
    "length": 10,
}


def test_encode_record_writes_the_pinned_line():
    line = encode_record(RECORD)
    assert line == (
        b'{"appended_at":1712345678.123456,"digest":"' + b"ab" * 32 + b'","group_id":"g",'
        b'"host":"h","incarnation":1,"length":10,"max_version":1,"min_version":0,'
        b'"n_samples":2,"offset":0,"payload":"buffer/groups/g.safetensors","position":3,'
        b'"prompt_id":"p\\u00e9\\"","seq":-1,"crc":"0c1e6ab7"}\n'
    )
    assert decode_record(line) == RECORD


def test_encode_record_refuses_nan():
    with pytest.raises(ValueError):
        encode_record({**RECORD, "appended_at": math.nan})


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"flag": True, "none": None},
        {"nested": {"b": 1, "a": [1.5, "x"]}},
        {"big": 2**70, "neg": -3, "tiny": 1e-300, "e": 1e22, "zero": -0.0},
        {"text": 'tab\t, quote", slash\\ , nul\x00, emoji \U0001f600, \u2028'},
        {"en": __import__("enum").IntEnum("E", "A")(1)},
    ],
)
def test_encode_record_matches_the_canonical_json_of_any_record(extra):
    rec = {**RECORD, **extra}
    body = json.dumps(rec, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    line = encode_record(rec)
    assert line[: len(body) - 1] == body[:-1]
    assert line[len(body) - 1 :].startswith(b',"crc":"')


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_encode_record_refuses_non_finite_floats(bad):
    with pytest.raises(ValueError):
        encode_record({**RECORD, "x": bad})


_UNPACKED = {k: v for k, v in RECORD.items() if k not in ("offset", "length")}


@pytest.mark.parametrize("base", [RECORD, _UNPACKED], ids=["packed", "single"])
@pytest.mark.parametrize(
    "change",
    [
        {},
        {"appended_at": 1e22},
        {"appended_at": -0.0},
        {"appended_at": 1e-300},
        {"appended_at": 3},  # an int where a float is usual
        {"position": True},  # bool is an int subclass: written as JSON true
        {"incarnation": __import__("enum").IntEnum("E", "A")(1)},
        {"seq": 2**70},
        {"host": 'tab\t, quote", slash\\ , nul\x00, emoji \U0001f600, \u2028'},
        {"prompt_id": 7},  # not a string
        {"digest": None},
    ],
)
def test_an_append_record_is_the_canonical_json(base, change):
    """The append records' direct writer (the usual key sets) gives the encoder's bytes."""
    rec = {**base, **change}
    body = json.dumps(rec, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    line = encode_record(rec)
    assert line[: len(body) - 1] == body[:-1]
    assert decode_record(line) == rec


@pytest.mark.parametrize("base", [RECORD, _UNPACKED], ids=["packed", "single"])
@pytest.mark.parametrize("bad", [{"appended_at": math.inf}, {"n_samples": np.int64(2)}])
def test_an_append_record_the_encoder_refuses_is_refused(base, bad):
    with pytest.raises((ValueError, TypeError)):
        encode_record({**base, **bad})
