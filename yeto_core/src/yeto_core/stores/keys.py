"""Validation of object store keys (shared by every store)."""

from __future__ import annotations

from yeto_core.errors import InvalidKeyError


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative POSIX path, else raise :class:`InvalidKeyError`.

    Refused: empty keys, absolute paths, ``..`` or ``.`` segments, empty segments
    (``a//b``), a trailing ``/``, backslashes and NUL.
    """
    if not isinstance(key, str) or not key:
        raise InvalidKeyError(f"object store key must be a non-empty string, got {key!r}")
    if "\x00" in key:
        raise InvalidKeyError(f"object store key {key!r} contains NUL; use printable characters")
    if "\\" in key:
        raise InvalidKeyError(
            f"object store key {key!r} contains a backslash; keys are POSIX paths, use '/'"
        )
    if key.startswith("/"):
        raise InvalidKeyError(
            f"object store key {key!r} is absolute; keys are relative to the store root"
        )
    parts = key.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise InvalidKeyError(
                f"object store key {key!r} has an empty, '.' or '..' segment; "
                "keys must stay inside the store root"
            )
    return key


def check_prefix(prefix: str) -> str:
    """A list prefix: empty, or a key-like string that may end with ``/``."""
    if prefix == "":
        return prefix
    body = prefix[:-1] if prefix.endswith("/") else prefix
    check_key(body)
    return prefix
