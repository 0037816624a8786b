"""What a run keeps under ``run/`` in its store, so that an island needs only the store.

Keys::

    run/config.json             the resolved run config (islands read it)
    run/head.json               the live head's start time (a start from the base sets
                                aside ledger rounds recorded before it)
    run/model/<files>           the base model the engines and the backend load
    run/model/manifest.json     sha256 per file, written last (the manifest protocol)

The head writes them before it launches any island; an island fetches the
model into its own working directory and verifies every file.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Optional

from yeto_core import serde
from yeto_core.config.load import RunConfig, config_from_dict, config_to_dict
from yeto_core.errors import ConfigError, NotFoundError, YetoError
from yeto_core.ports import ObjectStore
from yeto_core.records import ShardDigest
from yeto_core.stores.manifest import MANIFEST_NAME, digest_dir, download_verified, upload_files

CONFIG_KEY = "run/config.json"
HEAD_KEY = "run/head.json"
MODEL_PREFIX = "run/model"


def write_config(store: ObjectStore, config: RunConfig) -> None:
    """Put the resolved config where islands read it."""
    body = json.dumps(config_to_dict(config), indent=1, sort_keys=True, allow_nan=False)
    store.put(CONFIG_KEY, body.encode())


def read_config(store: ObjectStore) -> RunConfig:
    """The resolved config the head wrote (:class:`ConfigError` when there is none)."""
    try:
        raw = store.get(CONFIG_KEY)
    except NotFoundError:
        raise ConfigError(
            f"the store has no {CONFIG_KEY}; islands are started by `yeto run up`, which "
            "writes it first. Is YETO_STORE the run's store?"
        ) from None
    return config_from_dict(json.loads(raw))


def write_head(store: ObjectStore, *, started_at: float, pid: int, host: str) -> None:
    """Record the live head's start (read by trainer islands)."""
    body = {"started_at": started_at, "pid": pid, "host": host, "written_at": time.time()}
    store.put(HEAD_KEY, json.dumps(body, sort_keys=True).encode())


def head_started_at(store: ObjectStore) -> Optional[float]:
    """The live head's start time, or None when no head wrote one."""
    try:
        return float(json.loads(store.get(HEAD_KEY))["started_at"])
    except (NotFoundError, KeyError, ValueError, TypeError):
        return None


def model_manifest(store: ObjectStore) -> Optional[tuple[ShardDigest, ...]]:
    """The files of the stored base model, or None when none is stored."""
    try:
        raw = store.get(f"{MODEL_PREFIX}/{MANIFEST_NAME}")
    except NotFoundError:
        return None
    data = json.loads(raw)
    return tuple(serde.structure(f, ShardDigest, what="model manifest") for f in data["files"])


def publish_model(store: ObjectStore, model_dir: str | os.PathLike[str]) -> bool:
    """Upload ``model_dir`` as the run's base model unless the same files are stored.

    :returns: whether anything was uploaded.
    """
    files = digest_dir(model_dir)
    if model_manifest(store) == files:
        return False
    upload_files(store, MODEL_PREFIX, model_dir, files)
    body = {"files": [serde.unstructure(f) for f in files]}
    store.put(f"{MODEL_PREFIX}/{MANIFEST_NAME}", json.dumps(body, sort_keys=True).encode())
    return True


def fetch_model(store: ObjectStore, dest: str | os.PathLike[str]) -> Path:
    """Download the stored base model into ``dest`` (verified; reused when already there)."""
    files = model_manifest(store)
    if files is None:
        raise YetoError(
            f"the store has no base model under {MODEL_PREFIX}/; `yeto run up` uploads it "
            "before launching islands"
        )
    dest = Path(dest)
    marker = dest / ".yeto-model.json"
    want = json.dumps([serde.unstructure(f) for f in files], sort_keys=True)
    if marker.is_file() and marker.read_text() == want:
        return dest
    problems = download_verified(store, MODEL_PREFIX, files, dest)
    if problems:
        raise YetoError(f"the stored base model fails its digest check: {'; '.join(problems)}")
    marker.write_text(want)
    return dest


def config_dict(config: RunConfig) -> dict[str, Any]:
    """Plain data of ``config`` (the head's local ``config.json`` view)."""
    return config_to_dict(config)
