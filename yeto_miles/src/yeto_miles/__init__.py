"""yeto-miles: the miles trainer backend and the Miles rollout/reader/publisher plugins (Miles at run time only)."""

__version__ = "0.1.0"
