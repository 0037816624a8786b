"""Entry point of yeto-s3 (group ``yeto``, name ``s3``): the ``s3`` store and its preflight."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from yeto_core import hookimpl

CHECK_NAME = "s3-store"


@hookimpl
def yeto_register_object_stores(register):
    from yeto_s3.store import S3Store

    register(S3Store)


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def store_url_and_options(config: Any) -> tuple[Optional[str], dict[str, Any]]:
    """The store URL and options a run config names, or ``(None, {})``.

    Accepts any object or mapping whose ``store`` is a URL string, or is itself an
    object or mapping with ``url`` (and optional ``options``). Options may also sit
    next to it as ``store_options``.
    """
    store = _field(config, "store")
    options = _field(config, "store_options")
    if store is None:
        return None, {}
    if isinstance(store, str):
        url = store
    else:
        url = _field(store, "url")
        options = _field(store, "options") or options
    if not isinstance(url, str):
        return None, {}
    return url, dict(options or {})


@hookimpl
def yeto_preflight(config, report, offline):
    url, options = store_url_and_options(config)
    if url is None or not url.startswith("s3://"):
        return
    if offline:
        report.warn(CHECK_NAME, f"{url}: bucket not contacted (--offline)")
        return
    from yeto_s3.store import S3Store

    try:
        store = S3Store.from_url(url, **options)
        detail = store.check_writable()
    except Exception as exc:  # every failure becomes a readable check result
        report.fail(CHECK_NAME, f"{url}: {exc}")
        return
    report.ok(CHECK_NAME, detail)
