"""yeto-modal: the modal island provider and the modal-volume store."""

__version__ = "0.1.0"
