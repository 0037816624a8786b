"""yeto-dashboard: ``yeto dashboard RUN``, a live web page of a run, and its static export."""

__version__ = "0.1.0"

#: The charting library shipped in ``static/vendor/uplot`` (see its VENDORED.md).
UPLOT_VERSION = "1.6.32"
