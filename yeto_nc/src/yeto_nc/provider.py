"""The ``nc`` island provider: each island incarnation runs on one leased marketplace node.

``provider = "nc"`` in a ``[[samplers]]`` table; its ``provider_options``
are the pool's settings (:class:`PoolOptions`). :meth:`NcIslands.launch`
picks the cheapest offer that passes the filter, requests a lease running
``python -m yeto_core.islands.main`` with the launch's environment, and tries
the next offer (and again, until ``launch_timeout_s``) when a request is
refused. :meth:`NcIslands.status` maps the lease's state
(``evicted``/``expired`` -> ``IslandStatus.LOST``: the head fences that
incarnation and launches a replacement) and renews a lease that expires
within ``renew_before_s``. :meth:`NcIslands.release` releases the lease and
returns True only once the marketplace reports it ended with no process
left; it then keeps the lease's billing records (:meth:`NcIslands.costs`).

Lease records live in ``<state_dir>/nc/leases/<handle>.json`` (written before
the request, completed after), and every lease carries the labels
``yeto_run`` and ``yeto_handle``, so a restarted head finds the leases of its
run (:meth:`NcIslands.orphans`) even when the head died mid-request.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Optional

import attrs

from yeto_core.errors import ConfigError, YetoError
from yeto_core.ports import IslandProvider
from yeto_core.providers.env import stamp_submitted
from yeto_core.records import Event, IslandLaunch, IslandStatus
from yeto_nc.client import TERMINAL, LeaseClient, MarketplaceError, Refused

ENV_URL = "YETO_NC_URL"
ENV_TOKEN = "YETO_NC_TOKEN"


@attrs.frozen
class PoolOptions:
    """``provider_options`` of an ``nc`` sampler group.

    :ivar url: the marketplace (default: ``$YETO_NC_URL``).
    :ivar gpu: / :ivar region: the offer filter (empty: any).
    :ivar max_usd_per_hour: never rent a node dearer than this (0: no limit).
    :ivar min_nodes: / :ivar max_nodes: the group's node bounds; the group's
        ``islands`` must lie within them, and at most ``max_nodes`` leases of the
        group are held at once (replacements included).
    :ivar lease_s: the duration of a lease and of each renewal.
    :ivar renew_before_s: renew when the lease expires within this.
    :ivar launch_timeout_s: how long a launch keeps trying refused requests.
    :ivar release_timeout_s: how long a release waits for the marketplace to confirm.
    :ivar image: the node image (passed through to the marketplace).
    :ivar command: the island command on the node (default: this interpreter,
        ``-m <entry module>``; a real node names its own, e.g. ``["python", "-m",
        "yeto_core.islands.main"]``).
    """

    url: str = ""
    gpu: str = ""
    region: str = ""
    max_usd_per_hour: float = 0.0
    min_nodes: int = 0
    max_nodes: int = 64
    lease_s: float = 3600.0
    renew_before_s: float = 120.0
    launch_timeout_s: float = 120.0
    release_timeout_s: float = 60.0
    image: str = ""
    command: tuple[str, ...] = ()

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> PoolOptions:
        known = {f.name for f in attrs.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(
                f"[[samplers]] provider_options of the nc provider: unknown key(s) {unknown}; "
                f"known: {sorted(known)}"
            )
        kw = dict(options)
        if "command" in kw:
            kw["command"] = tuple(str(c) for c in kw["command"])
        kw.setdefault("url", os.environ.get(ENV_URL, ""))
        try:
            pool = cls(**kw)
        except TypeError as exc:
            raise ConfigError(f"nc provider_options: {exc}") from exc
        if not pool.url:
            raise ConfigError(
                "the nc provider needs the marketplace URL: set provider_options.url in the "
                f"[[samplers]] table or {ENV_URL} in the head's environment"
            )
        if not 0 <= pool.min_nodes <= pool.max_nodes or pool.max_nodes < 1:
            raise ConfigError(
                f"nc provider_options: need 0 <= min_nodes <= max_nodes and max_nodes >= 1, "
                f"got min_nodes={pool.min_nodes} max_nodes={pool.max_nodes}"
            )
        if pool.lease_s <= pool.renew_before_s:
            raise ConfigError(
                f"nc provider_options: lease_s ({pool.lease_s}) must exceed renew_before_s "
                f"({pool.renew_before_s}), or every status check renews"
            )
        return pool


_STATUS = {
    "pending": IslandStatus.STARTING,
    "running": IslandStatus.RUNNING,
    "evicting": IslandStatus.RUNNING,
    "exited": IslandStatus.EXITED,
    "evicted": IslandStatus.LOST,
    "expired": IslandStatus.LOST,
    "released": IslandStatus.GONE,
}


class NcIslands(IslandProvider):
    """Islands on leased marketplace nodes (see the module docstring).

    :param state_dir: the head's run dir (records under ``nc/``).
    :param client_factory: builds the marketplace client from ``(url, token)``; another
        marketplace is another factory.
    """

    PLUGIN_NAME = "nc"

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        client_factory: Callable[[str, Optional[str]], Any] = (
            lambda url, token: LeaseClient(url, token=token)
        ),
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.dir = Path(state_dir) / self.PLUGIN_NAME
        (self.dir / "leases").mkdir(parents=True, exist_ok=True)
        (self.dir / "billing").mkdir(parents=True, exist_ok=True)
        self._factory, self.clock, self.sleep = client_factory, clock, sleep
        self._clients: dict[str, Any] = {}
        self._mine: set[str] = set()
        self._events: dict[str, list[Event]] = {}
        self._last: dict[str, dict[str, Any]] = {}

    # -- records ---------------------------------------------------------------------

    def _client(self, url: str) -> Any:
        if url not in self._clients:
            self._clients[url] = self._factory(url, os.environ.get(ENV_TOKEN) or None)
        return self._clients[url]

    def _path(self, handle: str) -> Path:
        return self.dir / "leases" / f"{handle}.json"

    def record(self, handle: str) -> Optional[dict[str, Any]]:
        try:
            return json.loads(self._path(handle).read_text())
        except (OSError, ValueError):
            return None

    def _write(self, handle: str, rec: Mapping[str, Any]) -> None:
        tmp = self._path(handle).with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(rec), sort_keys=True))
        os.replace(tmp, self._path(handle))

    def _emit(self, handle: str, kind: str, **data: Any) -> None:
        self._events.setdefault(handle, []).append(
            Event(kind=kind, time=self.clock(), source=f"nc:{handle}", data=data)
        )

    def held(self, url: Optional[str] = None) -> list[str]:
        """Handles with a lease record (not yet released)."""
        out = []
        for p in sorted((self.dir / "leases").glob("*.json")):
            rec = self.record(p.stem)
            if rec is not None and (url is None or rec["url"] == url):
                out.append(p.stem)
        return out

    # -- the port ----------------------------------------------------------------------

    def launch(self, launch: IslandLaunch) -> str:
        pool = PoolOptions.parse(launch.options)
        handle = launch.handle
        if self.record(handle) is not None:
            raise YetoError(f"nc: island {handle} already holds a lease; release it first")
        group = launch.island.rsplit("-", 1)[0]
        held = [self.record(h) for h in self.held(pool.url)]
        if sum(1 for r in held if r and r["island"].rsplit("-", 1)[0] == group) >= pool.max_nodes:
            raise YetoError(
                f"nc: the pool of {launch.island} holds max_nodes={pool.max_nodes} leases; "
                "raise provider_options.max_nodes or lower the group's islands"
            )
        client = self._client(pool.url)
        labels = {"yeto_run": launch.run_id, "yeto_handle": handle, "yeto_island": launch.island}
        rec: dict[str, Any] = {
            "url": pool.url,
            "run_id": launch.run_id,
            "island": launch.island,
            "incarnation": launch.incarnation,
            "lease_id": None,
            "lease_s": pool.lease_s,
            "renew_before_s": pool.renew_before_s,
            "release_timeout_s": pool.release_timeout_s,
        }
        self._write(handle, rec)  # before the request: a crashed head finds it by label
        command = list(pool.command) or [sys.executable, "-m", launch.entry_module]
        # submitted now: the wait for an offer counts towards this incarnation's start
        env = stamp_submitted({**launch.env, "YETO_HANDLE": handle}, self.clock())
        deadline = self.clock() + pool.launch_timeout_s
        tries = 0
        while True:
            offers = client.offers(
                gpu=pool.gpu or None,
                region=pool.region or None,
                max_usd_per_hour=pool.max_usd_per_hour or None,
            )
            offers = sorted(
                (o for o in offers if o["available"] > 0),
                key=lambda o: (o["usd_per_hour"], o["id"]),
            )
            for offer in offers:
                tries += 1
                try:
                    lease = client.request_lease(
                        offer["id"],
                        duration_s=pool.lease_s,
                        command=command,
                        env=env,
                        labels=labels,
                        image=pool.image,
                        max_usd_per_hour=pool.max_usd_per_hour or None,
                    )
                except Refused as exc:
                    self._emit(handle, "nc_lease_refused", offer=offer["id"], code=exc.code)
                    continue
                rec.update(
                    lease_id=lease["id"], offer=offer["id"], usd_per_hour=offer["usd_per_hour"]
                )
                self._write(handle, rec)
                self._mine.add(handle)
                self._last[handle] = lease
                self._emit(
                    handle,
                    "nc_lease_granted",
                    lease=lease["id"],
                    offer=offer["id"],
                    usd_per_hour=offer["usd_per_hour"],
                    expires_at=lease["expires_at"],
                    tries=tries,
                )
                return handle
            if self.clock() >= deadline:
                self._path(handle).unlink(missing_ok=True)
                raise YetoError(
                    f"nc: no lease for {handle} within launch_timeout_s={pool.launch_timeout_s} "
                    f"({tries} request(s) refused, {len(offers)} offer(s) passed the filter "
                    f"gpu={pool.gpu!r} region={pool.region!r} "
                    f"max_usd_per_hour={pool.max_usd_per_hour}); widen the filter or retry"
                )
            self.sleep(0.2)

    def status(self, handle: str) -> IslandStatus:
        rec = self.record(handle)
        if rec is None or rec.get("lease_id") is None:
            return IslandStatus.GONE
        client = self._client(rec["url"])
        try:
            lease = client.lease(rec["lease_id"])
        except MarketplaceError as exc:
            if exc.code == "not_found":
                return IslandStatus.GONE
            self._emit(handle, "nc_status_failed", error=str(exc))
            last = self._last.get(handle)
            return _STATUS[last["state"]] if last else IslandStatus.STARTING
        before = self._last.get(handle) or {}
        self._last[handle] = lease
        state = lease["state"]
        if lease.get("eviction") and not before.get("eviction"):
            self._emit(handle, "nc_eviction_notice", lease=lease["id"], **lease["eviction"])
        if state != before.get("state"):
            self._emit(handle, "nc_lease_state", lease=lease["id"], state=state)
        if state in ("pending", "running") and not rec.get("renew_refused"):
            left = lease["expires_at"] - self.clock()
            if left < rec["renew_before_s"]:
                try:
                    lease = client.renew(lease["id"], rec["lease_s"])
                    self._emit(
                        handle,
                        "nc_lease_renewed",
                        lease=lease["id"],
                        expires_at=lease["expires_at"],
                        left_s=left,
                    )
                except MarketplaceError as exc:
                    rec["renew_refused"] = True
                    self._write(handle, rec)
                    self._emit(
                        handle, "nc_renew_refused", lease=lease["id"], code=exc.code, left_s=left
                    )
        return _STATUS[state]

    def events(self, handle: str) -> Iterator[Event]:
        return iter(self._events.pop(handle, []))

    def release(self, handle: str) -> bool:
        rec = self.record(handle)
        if rec is None:
            return True
        if rec.get("lease_id") is None:  # died mid-request: find the lease by its label
            found = [
                x
                for x in self._client(rec["url"]).leases(label=f"yeto_handle={handle}")
                if x["labels"].get("yeto_run") == rec["run_id"]
            ]
            if not found:
                self._path(handle).unlink(missing_ok=True)
                return True
            rec["lease_id"] = found[0]["id"]
            self._write(handle, rec)
        client = self._client(rec["url"])
        lid = rec["lease_id"]
        deadline = self.clock() + float(rec.get("release_timeout_s", 60.0))
        asked = False
        while True:
            try:
                lease = client.lease(lid)
            except MarketplaceError as exc:
                if exc.code != "not_found":
                    raise
                lease = {"state": "released", "processes_gone": True}
            if lease["state"] in TERMINAL and lease["processes_gone"]:
                break
            if lease["state"] not in TERMINAL and not asked:
                client.release(lid)
                asked = True
                continue
            if self.clock() >= deadline:
                return False
            self.sleep(0.05)
        bills = client.billing(lease_id=lid)
        (self.dir / "billing" / f"{handle}.json").write_text(
            json.dumps(
                {
                    "handle": handle,
                    "island": rec["island"],
                    "lease_id": lid,
                    "state": lease["state"],
                    "records": bills,
                },
                sort_keys=True,
            )
        )
        self._emit(
            handle,
            "nc_lease_released",
            lease=lid,
            state=lease["state"],
            usd=sum(b["usd"] for b in bills),
        )
        self._path(handle).unlink(missing_ok=True)
        self._mine.discard(handle)
        self._last.pop(handle, None)
        return True

    def orphans(self) -> list[str]:
        """Held leases of this run that this object did not launch (records and labels)."""
        out = {h for h in self.held() if h not in self._mine}
        runs = {(r["url"], r["run_id"]) for r in map(self.record, self.held()) if r}
        for url, run_id in runs:
            for lease in self._client(url).leases(label=f"yeto_run={run_id}"):
                handle = lease["labels"].get("yeto_handle", "")
                if lease["state"] in TERMINAL or not handle or handle in self._mine:
                    continue
                if self.record(handle) is None:
                    self._write(
                        handle,
                        {
                            "url": url,
                            "run_id": run_id,
                            "lease_id": lease["id"],
                            "island": lease["labels"].get("yeto_island", handle),
                            "incarnation": -1,
                            "lease_s": 0,
                            "renew_before_s": 0,
                        },
                    )
                out.add(handle)
        return sorted(out)

    def returncode(self, handle: str) -> Optional[int]:
        last = self._last.get(handle)
        return None if last is None else last.get("exit_code")

    def pool_bounds(self, options: Mapping[str, Any]) -> Optional[tuple[int, int]]:
        """``min_nodes``..``max_nodes`` of the group: its islands join and leave (the head)."""
        pool = PoolOptions.parse(options)
        return pool.min_nodes, pool.max_nodes

    def replace_soon(self, handle: str) -> bool:
        """The lease will end: its renewal was refused, or the node got an eviction notice."""
        rec = self.record(handle)
        if rec is None or rec.get("lease_id") is None:
            return False
        last = self._last.get(handle) or {}
        return bool(rec.get("renew_refused") or last.get("eviction"))

    def log_hint(self, handle: str) -> str:
        rec = self.record(handle)
        if rec is None or rec.get("lease_id") is None:
            return ""
        return f"{rec['url']}/v1/leases/{rec['lease_id']}"

    # -- costs -------------------------------------------------------------------------

    def lease_cost(self, handle: str) -> Optional[float]:
        """The billed USD of a released handle (None: not released by this state dir)."""
        try:
            data = json.loads((self.dir / "billing" / f"{handle}.json").read_text())
        except (OSError, ValueError):
            return None
        return round(sum(float(b["usd"]) for b in data["records"]), 6)

    def price_per_hour(self, handle: str) -> Optional[float]:
        """The USD per hour of the offer the handle's lease was granted on (None: no lease).

        The resource ledger's price of the node when the core asks providers for it."""
        rec = self.record(handle)
        if rec is None or rec.get("usd_per_hour") is None:
            return None
        return float(rec["usd_per_hour"])

    def billed(self) -> dict[str, dict[str, Any]]:
        """The marketplace's billing records per released handle (``yeto cost`` shows them).

        ``{handle: {"island", "lease_id", "usd", "seconds", "records"}}``; ``usd`` is the sum
        of the records' ``usd`` (rounded to 1e-6 USD, as the marketplace states it).
        """
        out: dict[str, dict[str, Any]] = {}
        for p in sorted((self.dir / "billing").glob("*.json")):
            try:
                data = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            recs = data.get("records", [])
            out[p.stem] = {
                "island": data.get("island", ""),
                "lease_id": data.get("lease_id", ""),
                "usd": round(sum(float(b["usd"]) for b in recs), 6),
                "seconds": sum(float(b.get("seconds", 0)) for b in recs),
                "records": len(recs),
            }
        return out

    def costs(self) -> dict[str, float]:
        """Billed USD per released handle."""
        out = {}
        for p in sorted((self.dir / "billing").glob("*.json")):
            cost = self.lease_cost(p.stem)
            if cost is not None:
                out[p.stem] = cost
        return out
