"""The bridge between a trainer incarnation and its Miles process: one object per message
in the run's store under ``<prefix>/`` (the layout is in docs/miles.md: How a round flows)."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any, Optional

from yeto_core.batch_reader import make_padding
from yeto_core.errors import NotFoundError, YetoError
from yeto_core.group_codec import decode_group, encode_group

#: Why the other side is gone (None: it is there).
Alive = Callable[[], Optional[str]]


class BridgeError(YetoError):
    """The other side of the Miles bridge is gone or did not answer in time."""


class Bridge:
    def __init__(self, store: Any, prefix: str) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/")

    def key(self, kind: str, rollout_id: Optional[int] = None, ext: str = ".json") -> str:
        """``<prefix>/<kind>``, or ``<prefix>/<kind>/<rollout_id:08d><ext>``."""
        tail = "" if rollout_id is None else f"/{int(rollout_id):08d}{ext}"
        return f"{self.prefix}/{kind}{tail}"

    def put_json(self, key: str, data: dict[str, Any]) -> None:
        self.store.put(key, json.dumps(data, sort_keys=True).encode())

    def get_json(self, key: str) -> Optional[dict[str, Any]]:
        try:
            return json.loads(self.store.get(key))
        except NotFoundError:
            return None

    def first_request(self) -> Optional[int]:
        """The lowest rollout id Miles asked for, or None before it asked."""
        keys = sorted(self.store.list(self.key("requests") + "/"))
        return int(keys[0].rsplit("/", 1)[1][:8]) if keys else None

    def close(self) -> None:
        self.store.put(self.key("closed"), b"closed")

    def gone(self, parent: str) -> Optional[str]:
        """Why the trainer incarnation (``parent``: its ``"host:pid"``) is gone, or None."""
        if self.store.exists(self.key("closed")):
            return "the trainer incarnation closed the bridge (it drained or failed)"
        host, _, pid = str(parent).rpartition(":")
        if host == socket.gethostname() and pid.isdigit():  # its process, on the same host only
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return f"the trainer incarnation (pid {pid}) that launched Miles is gone"
            except PermissionError:
                pass
        return None

    def put_batch(self, rollout_id: int, batch: Any) -> None:
        """The reader's batch for Miles' rollout ``rollout_id``; ``round.json`` last."""
        base = self.key("batches", rollout_id, "")
        for k, g in enumerate(batch.groups):
            self.store.put(f"{base}/g{k:05d}.st", encode_group(g))
        template = None
        if batch.padding_from is not None and batch.padding:
            pos, idx = batch.padding_from
            template = [list(batch.positions).index(pos), int(idx)]
        record = {
            "rollout_id": int(rollout_id),
            "positions": [int(p) for p in batch.positions],
            "policy_version": int(batch.policy_version),
            "n_padding": len(batch.padding),
            "padding_template": template,
            "group_size": int(batch.group_size),
            "groups_per_round": int(batch.groups_per_round),
        }
        self.put_json(f"{base}/round.json", record)

    def get_batch(self, rollout_id: int) -> Optional[dict[str, Any]]:
        """The round record with ``groups`` and ``padding`` loaded, or None before it is there."""
        base = self.key("batches", rollout_id, "")
        rec = self.get_json(f"{base}/round.json")
        if rec is None:
            return None
        names = [f"{base}/g{k:05d}.st" for k in range(len(rec["positions"]))]
        groups = [decode_group(self.store.get(n), where=n) for n in names]
        padding: tuple[Any, ...] = ()
        if rec["n_padding"]:
            g, idx = rec["padding_template"]
            padding = make_padding(groups[g].samples[idx], int(rec["n_padding"]))
        return dict(rec, groups=groups, padding=padding)

    def drop_batch(self, rollout_id: int) -> None:
        base = self.key("batches", rollout_id, "")
        self.store.delete(f"{base}/round.json")  # first: Miles never sees a round half gone
        for key in list(self.store.list(base + "/")):
            self.store.delete(key)

    def wait(
        self, get: Callable[[], Any], *, what: str, timeout_s: float, alive: Alive, poll_s: float
    ) -> Any:
        """Poll ``get()`` until it returns something; ``alive()`` returns why the peer is gone."""
        deadline = time.monotonic() + timeout_s
        while (value := get()) is None:
            gone = alive()
            if gone:
                raise BridgeError(f"while waiting for {what}: {gone}")
            if time.monotonic() > deadline:
                raise BridgeError(
                    f"{what} did not come within {timeout_s:g} s (bridge {self.prefix}); "
                    "see the Miles log in the incarnation's work dir"
                )
            time.sleep(poll_s)
        return value
