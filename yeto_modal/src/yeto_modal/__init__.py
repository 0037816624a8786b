"""yeto-modal: the modal island provider and the modal-volume store."""

from collections.abc import Iterable

from yeto_core.errors import ConfigError

__version__ = "0.1.0"


def refuse_unknown(where: str, given: Iterable[str], allowed: Iterable[str]) -> None:
    """A :class:`ConfigError` naming ``where``'s unknown keys and the allowed ones."""
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {unknown}; allowed: {', '.join(sorted(allowed))}"
        )
