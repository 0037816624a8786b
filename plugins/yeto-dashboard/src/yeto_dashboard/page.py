"""The page: one HTML template, served with links or exported with everything inlined."""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path
from typing import Any, Optional

from yeto_dashboard import UPLOT_VERSION, __version__

STATIC_DIR = Path(str(resources.files("yeto_dashboard") / "static"))
UPLOT_JS = "vendor/uplot/uPlot.iife.min.js"
UPLOT_CSS = "vendor/uplot/uPlot.min.css"


def _static(name: str) -> str:
    return (STATIC_DIR / name).read_text(encoding="utf-8")


def _inline_json(data: Any) -> str:
    """JSON safe inside a <script> element (no ``</script>``, no ``<!--``)."""
    text = json.dumps(data, default=str, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(
    *, mode: str, refresh_s: float = 1.0, title: str = "", data: Optional[Any] = None
) -> str:
    """The page: ``mode`` ``live`` (links to /static, polls /api/data) or ``static`` (inlined)."""
    template = _static("index.html")
    config = {
        "mode": mode,
        "url": "api/data",
        "refresh_ms": int(refresh_s * 1000),
        "version": __version__,
        "uplot_version": UPLOT_VERSION,
    }
    if mode == "live":
        assets = (
            f'<link rel="stylesheet" href="static/{UPLOT_CSS}">\n'
            '<link rel="stylesheet" href="static/app.css">'
        )
        scripts = (
            f'<script src="static/{UPLOT_JS}"></script>\n<script src="static/app.js"></script>'
        )
        data_tag = ""
    else:
        assets = f"<style>\n{_static(UPLOT_CSS)}\n</style>\n<style>\n{_static('app.css')}\n</style>"
        scripts = (
            f"<script>\n{_static(UPLOT_JS)}\n</script>\n<script>\n{_static('app.js')}\n</script>"
        )
        data_tag = f'<script id="yeto-data" type="application/json">{_inline_json(data)}</script>'
    return (
        template.replace("<!--TITLE-->", html.escape(title or "run"))
        .replace("<!--ASSETS-->", assets)
        .replace(
            "<!--CONFIG-->",
            f"<script>window.YETO_CONFIG = {_inline_json(config)};</script>\n{data_tag}",
        )
        .replace("<!--SCRIPTS-->", scripts)
    )
