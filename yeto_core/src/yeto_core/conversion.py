"""The built-in ``none`` conversion: a pool whose nodes never change role.

``[conversion] name = "none"`` (the default). Providers with convertible nodes
register their own :class:`~yeto_core.ports.ConversionPort`.
"""

from __future__ import annotations

from typing import Any

from yeto_core.errors import YetoError
from yeto_core.ports import ConversionPort


class NoConversion(ConversionPort):
    """No node can convert: :meth:`capacity` is 0 and a conversion is refused."""

    PLUGIN_NAME = "none"

    def __init__(self, **options: Any) -> None:
        if options:
            raise YetoError(f"conversion 'none' takes no options; got {sorted(options)}")

    def capacity(self) -> int:
        return 0

    def to_trainer(self, node: str) -> None:
        raise YetoError(
            f"cannot convert {node!r} to the trainer: [conversion] name = 'none' has no "
            "convertible nodes; choose a provider's conversion"
        )

    def to_sampler(self, node: str) -> None:
        raise YetoError(
            f"cannot convert {node!r} to a sampler: [conversion] name = 'none' has no "
            "convertible nodes; choose a provider's conversion"
        )
