"""yeto-sky: the sky island provider (SkyPilot clusters)."""

__version__ = "0.1.0"
