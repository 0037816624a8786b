"""Index records of the sample buffer: one JSON object per group, checked by a CRC-32.

A record's last key ``crc`` is the CRC-32 of the record's canonical JSON without
it; a record that fails its check is never parsed into an entry. Group ids are
checked before they become key segments.
"""

from __future__ import annotations

import json
import re
import zlib
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


def encode_record(record: dict[str, Any]) -> bytes:
    """One index record as a JSON line whose last key ``crc`` checks the rest."""
    body = _RECORD_JSON.encode(record).encode()
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
