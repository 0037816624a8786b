"""Errors raised by yeto. Every message says what was wrong, where, and what to do."""

from __future__ import annotations


class YetoError(Exception):
    """Base class of every error yeto raises on purpose."""


class ConfigError(YetoError):
    """A configuration value is missing, unknown or out of range.

    The message names the path (``trainer.batch``) and the allowed values.
    """


class PluginError(YetoError):
    """A plugin could not be loaded, or a registration is inconsistent."""


class UnknownPluginError(PluginError, LookupError):
    """An implementation name that no installed plugin registers."""


class DuplicatePluginError(PluginError):
    """Two plugins registered the same implementation name for one port."""


class StoreError(YetoError):
    """An object store operation failed."""


class InvalidKeyError(StoreError, ValueError):
    """An object store key is not a safe relative POSIX path."""


class NotFoundError(StoreError, KeyError):
    """A key that does not exist in the object store."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable.
        return str(self.args[0]) if self.args else "not found"


class SampleBufferError(YetoError):
    """The sample buffer refused an operation (bad group, torn index, ...)."""


class IllegalTransitionError(YetoError):
    """A lifecycle was asked to do something its current state does not allow."""


class CutError(YetoError):
    """A consistent cut is missing, incomplete or fails its digest check."""


class ReleaseError(YetoError):
    """A policy release is incomplete or fails its digest or checksum check.

    :attr:`reason` names the check that failed (a policy follower's ``release_refused``
    event reports it): ``digest_mismatch`` unless a subclass sets another (a delta's
    ``DeltaError`` sets one per check).
    """

    reason: str = "digest_mismatch"
