"""yeto-nc: the nc island provider (a GPU marketplace pool with leases and evictions)."""

__version__ = "0.1.0"
