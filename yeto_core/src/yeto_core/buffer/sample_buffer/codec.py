"""Index records of the sample buffer: one JSON object per group, checked by a CRC-32.

A record's last key ``crc`` is the CRC-32 of the record's canonical JSON without
it; a record that fails its check is never parsed into an entry. Group ids are
checked before they become key segments.
"""

from __future__ import annotations

import json
import re
import zlib
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any, Optional

from yeto_core.errors import SampleBufferError
from yeto_core.records import CORRUPT_INDEX_HOST, GroupEntry

_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_CRC_MARK = b',"crc":"'


def check_group_id(group_id: str, what: str = "group id") -> str:
    """Return ``group_id`` if it is safe as a key segment, else raise :class:`SampleBufferError`."""
    if not isinstance(group_id, str) or not _ID_RE.fullmatch(group_id):
        raise SampleBufferError(
            f"{what} {group_id!r} is not allowed: use 1-200 characters of letters, digits, "
            "'.', '_' or '-', starting with a letter or digit"
        )
    return group_id


#: canonical JSON (sorted keys, compact, no NaN): one encoder for every record
_RECORD_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)


#: the keys of the record an append writes (a packed group's adds ``offset``, ``length``)
_APPEND_KEYS = frozenset(
    (
        "appended_at",
        "digest",
        "group_id",
        "host",
        "incarnation",
        "max_version",
        "min_version",
        "n_samples",
        "payload",
        "position",
        "prompt_id",
        "seq",
    )
)
_PACKED_KEYS = _APPEND_KEYS | {"length", "offset"}
_INF = float("inf")


def _append_record_json(r: dict[str, Any]) -> Optional[str]:
    """``_RECORD_JSON.encode(r)`` of the record an append writes, written out directly
    (every append writes one: the encoder's set-up costs more than the record); None
    for any other record, or one whose values are not plain ``str``/``int``/finite
    ``float`` (the encoder then writes it, or refuses it)."""
    keys = r.keys()
    packed = keys == _PACKED_KEYS
    if not packed and keys != _APPEND_KEYS:
        return None
    at, digest, gid, host = r["appended_at"], r["digest"], r["group_id"], r["host"]
    inc, hi, lo, n = r["incarnation"], r["max_version"], r["min_version"], r["n_samples"]
    payload, pos, pid, seq = r["payload"], r["position"], r["prompt_id"], r["seq"]
    length, offset = (r["length"], r["offset"]) if packed else (0, 0)
    if not (
        type(at) is float
        and -_INF < at < _INF
        and type(digest) is str
        and type(gid) is str
        and type(host) is str
        and type(payload) is str
        and type(pid) is str
        and type(inc) is int
        and type(hi) is int
        and type(lo) is int
        and type(n) is int
        and type(pos) is int
        and type(seq) is int
        and type(length) is int
        and type(offset) is int
    ):
        return None
    length_s, offset_s = (f'"length":{length},', f'"offset":{offset},') if packed else ("", "")
    return (
        f'{{"appended_at":{at!r},"digest":{_json_str(digest)},"group_id":{_json_str(gid)},'
        f'"host":{_json_str(host)},"incarnation":{inc},{length_s}"max_version":{hi},'
        f'"min_version":{lo},"n_samples":{n},{offset_s}"payload":{_json_str(payload)},'
        f'"position":{pos},"prompt_id":{_json_str(pid)},"seq":{seq}}}'
    )


def encode_record(record: dict[str, Any]) -> bytes:
    """One index record as a JSON line whose last key ``crc`` checks the rest."""
    text = _append_record_json(record)
    body = (_RECORD_JSON.encode(record) if text is None else text).encode()
    crc = zlib.crc32(body)
    return body[:-1] + b'%s%08x"}\n' % (_CRC_MARK, crc)


def decode_record(line: bytes) -> Optional[dict[str, Any]]:
    """The record of a line written by :func:`encode_record`, or None if it fails its check."""
    line = line.rstrip(b"\n")
    i = line.rfind(_CRC_MARK)
    if i < 0 or len(line) != i + len(_CRC_MARK) + 10 or not line.endswith(b'"}'):
        return None
    body = line[:i] + b"}"
    try:
        if int(line[i + len(_CRC_MARK) : -2], 16) != zlib.crc32(body):
            return None
        rec = json.loads(body)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def quarantined_record(position: int) -> dict[str, Any]:
    """The stand-in of a complete index record that fails its checksum.

    Its position stays taken (positions stay dense and nothing shifts); the reader
    skips it as ``quarantined`` (host :data:`~yeto_core.records.CORRUPT_INDEX_HOST`,
    no payload).
    """
    return {
        "position": position,
        "group_id": f"corrupt-index-line-{position}",
        "prompt_id": "",
        "host": CORRUPT_INDEX_HOST,
        "incarnation": -1,
        "n_samples": 0,
        "min_version": 0,
        "max_version": 0,
        "appended_at": 0.0,
        "payload": "",
    }


def entry_from(rec: dict[str, Any], where: str) -> GroupEntry:
    try:
        return GroupEntry(**rec)
    except TypeError as exc:
        raise SampleBufferError(
            f"index record at {where} has unexpected fields ({exc}); "
            "it was written by another yeto version"
        ) from None


_entry_from = entry_from
