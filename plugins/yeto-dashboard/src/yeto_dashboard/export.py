"""``yeto dashboard RUN --export report.html``: one self-contained HTML file.

The views' data, the styles, the page's script and the chart library are
inlined, so the file opens offline and can be attached to an issue or a paper.
It shows the run as it was when exported.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from yeto_dashboard.model import build, snapshot
from yeto_dashboard.page import render_page


def export_html(source: Any, path: Path) -> Path:
    """Write the report of ``source`` to ``path`` (atomically); returns ``path``."""
    data = build(snapshot(source))
    text = render_page(mode="static", title=source.label, data=data)
    path = Path(path)
    if source.run_dir is not None and _inside(path, Path(source.run_dir)):
        from yeto_dashboard.source import DashboardError

        raise DashboardError(
            f"{path} is inside the run dir {source.run_dir}; the dashboard never writes to a "
            "run: export somewhere else"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False
