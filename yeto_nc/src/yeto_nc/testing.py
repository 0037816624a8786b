"""A GPU marketplace simulator: the lease API of ``docs/nc-api.md`` on 127.0.0.1.

:class:`Marketplace` is a real HTTP server (stdlib ``http.server`` in a
thread). Each lease's start command runs as a local process group. A seed
and a scenario (a dict, or a JSON file) decide the storm, so a test or a
bench replays the same one: which lease requests are refused, which leases
are evicted, when, and with how much notice, which renewals are refused (so
those leases expire). Decisions are drawn per request number and per lease
number (not per wall-clock instant), so timing noise does not change them.

Scenario keys (all optional)::

    {"seed": 0,
     "offers": [{"id": "h100-eu", "gpu": "H100", "gpus": 1, "region": "eu",
                 "usd_per_hour": 2.0, "available": 8}],
     "start_delay_s": 0.1,          # pending -> running
     "max_duration_s": 3600,        # a lease (or renewal) never runs longer
     "refuse_p": 0.0,               # probability a lease request is refused
     "evict_p": 0.0,                # probability a lease is evicted while running
     "evict_after_s": [5, 30],      # uniform, from its start
     "evict_after_progress": [3, 9],  # instead: once the node made this much progress
                                      # (uniform; needs Marketplace(progress=...))
     "notice_p": 0.5,               # probability an eviction gives notice
     "grace_s": [1, 5],             # uniform notice length (0 when no notice)
     "renew_refuse_p": 0.0,         # probability a lease's renewals are refused
     "evictions": [{"lease": 2, "after_s": 3, "grace_s": 0}]}   # exact, by lease number

**Evictions on demand.** A test or a bench evicts a running lease when it chooses
(e.g. while the node's trials run): :meth:`Marketplace.evict`, or over HTTP
``POST /sim/leases/<id>/evict`` with ``{"grace_s": g}`` (a route of the simulator
only, not of the lease API). ``g > 0`` gives notice now and evicts ``g`` seconds
later; ``g = 0`` evicts at the next tick (after an earlier notice: counted as an
eviction with notice).

Billing is per second from the lease's start (``ceil`` of the held time).

**Evictions driven by progress.** With ``evict_after_progress`` an eviction
comes once ``progress(env)`` (a callable given to :class:`Marketplace`, called
with the lease's environment at most every ``progress_poll_s``) reaches the
lease's drawn count, e.g. the groups the node appended to the run's buffer; the
notice and the grace follow from then. A storm then does not depend on how
fast the machine is: the same seed evicts each node at the same point of its
work.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional
from urllib.parse import parse_qs, urlparse

from yeto_nc.client import TERMINAL

DEFAULT_OFFERS = [
    {
        "id": "sim-a10",
        "gpu": "A10",
        "gpus": 1,
        "region": "eu",
        "usd_per_hour": 0.9,
        "available": 64,
    },
    {
        "id": "sim-h100",
        "gpu": "H100",
        "gpus": 1,
        "region": "us",
        "usd_per_hour": 2.5,
        "available": 64,
    },
]


class _Lease:
    def __init__(self, number: int, lid: str, offer: dict[str, Any], req: dict[str, Any]) -> None:
        self.number, self.id, self.offer, self.req = number, lid, offer, req
        self.state = "pending"
        self.created_at = time.time()
        self.started_at: Optional[float] = None
        self.ended_at: Optional[float] = None
        self.expires_at = 0.0
        self.eviction: Optional[dict[str, float]] = None
        self.evict_plan: Optional[tuple[float, float]] = None  # (after_s, grace_s)
        self.evict_progress: Optional[int] = None  # evict at this progress instead of after_s
        self.progress = 0
        self.progress_at = 0.0
        self.renew_refused = False
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.exit_code: Optional[int] = None
        self.kill_at: Optional[float] = None  # SIGKILL deadline after a SIGTERM

    def gone(self) -> bool:
        if self.proc is None:
            return True
        self.proc.poll()
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "offer_id": self.offer["id"],
            "state": self.state,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "expires_at": self.expires_at,
            "ended_at": self.ended_at,
            "usd_per_hour": self.offer["usd_per_hour"],
            "labels": dict(self.req.get("labels") or {}),
            "eviction": dict(self.eviction) if self.eviction else None,
            "exit_code": self.exit_code,
            "processes_gone": self.state in TERMINAL and self.gone(),
        }

    def bill(self, now: float) -> dict[str, Any]:
        start = self.started_at
        end = self.ended_at
        held = 0.0 if start is None else (end if end is not None else now) - start
        seconds = max(0, math.ceil(held - 1e-9))
        price = float(self.offer["usd_per_hour"])
        return {
            "lease_id": self.id,
            "start": start if start is not None else self.created_at,
            "end": end if (end is not None or start is None) else None,
            "seconds": seconds,
            "usd_per_hour": price,
            "usd": round(seconds * price / 3600.0, 6),
        }


class Marketplace:
    """The simulator. Use as a context manager, or :meth:`start` / :meth:`stop`.

    :param scenario: the storm (see the module docstring), or a path to a JSON file.
    :param work_dir: where each lease's process runs (``<work_dir>/<lease>``) and logs.
    :param tick_s: how often evictions, expiries and exits are applied.
    """

    def __init__(
        self,
        scenario: Mapping[str, Any] | str | os.PathLike[str] | None = None,
        *,
        work_dir: Optional[str | os.PathLike[str]] = None,
        tick_s: float = 0.02,
        progress: Optional[Callable[[dict[str, str]], int]] = None,
        progress_poll_s: float = 0.25,
    ) -> None:
        if scenario is None:
            scenario = {}
        elif not isinstance(scenario, Mapping):
            scenario = json.loads(Path(scenario).read_text())
        self.scenario = dict(scenario)
        self.seed = int(self.scenario.get("seed", 0))
        self.offers = {o["id"]: dict(o) for o in self.scenario.get("offers", DEFAULT_OFFERS)}
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="yeto-nc-sim-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.tick_s = tick_s
        self.progress, self.progress_poll_s = progress, float(progress_poll_s)
        if self.scenario.get("evict_after_progress") and progress is None:
            raise ValueError(
                "the scenario sets evict_after_progress: give Marketplace(progress=...) "
                "(the node's progress from its lease environment)"
            )
        self.leases: dict[str, _Lease] = {}
        self.counts = {
            "requests": 0,
            "refused": 0,
            "leases": 0,
            "evicted": 0,
            "evicted_without_notice": 0,
            "expired": 0,
            "released": 0,
            "renewed": 0,
            "renew_refused": 0,
        }
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._server: Optional[ThreadingHTTPServer] = None
        self._threads: list[threading.Thread] = []

    # -- life ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the marketplace first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> str:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        for target in (self._server.serve_forever, self._run_ticks):
            t = threading.Thread(target=target, daemon=True, name="yeto-nc-sim")
            t.start()
            self._threads.append(t)
        return self.url

    def stop(self) -> None:
        """Stop the server and kill every lease's process group (verified)."""
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for t in self._threads:
            t.join(timeout=10)
        with self._lock:
            for lease in self.leases.values():
                if lease.state not in TERMINAL:
                    self._end(lease, "released", time.time())
                self._kill(lease, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while not lease.gone() and time.monotonic() < deadline:
                    time.sleep(0.01)

    def __enter__(self) -> Marketplace:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- decisions -------------------------------------------------------------------

    def _rng(self, *key: Any) -> random.Random:
        return random.Random(":".join(str(k) for k in (self.seed, *key)))

    def _plan(self, lease: _Lease) -> None:
        s = self.scenario
        for e in s.get("evictions", ()):
            if int(e["lease"]) == lease.number:
                lease.evict_plan = (float(e["after_s"]), float(e.get("grace_s", 0.0)))
                break
        rng = self._rng("lease", lease.number)
        evict, after, notice, grace = (rng.random() for _ in range(4))
        if lease.evict_plan is None and evict < float(s.get("evict_p", 0.0)):
            lo, hi = s.get("evict_after_s", (5.0, 30.0))
            glo, ghi = s.get("grace_s", (1.0, 5.0))
            g = glo + grace * (ghi - glo) if notice < float(s.get("notice_p", 0.5)) else 0.0
            lease.evict_plan = (lo + after * (hi - lo), g)
            if s.get("evict_after_progress"):
                plo, phi = s["evict_after_progress"]
                lease.evict_progress = int(plo + round(after * (int(phi) - int(plo))))
        lease.renew_refused = rng.random() < float(s.get("renew_refuse_p", 0.0))

    # -- the API (called by the handler under the lock) ------------------------------

    def api_offers(self, q: dict[str, str]) -> tuple[int, Any]:
        out = []
        for o in self.offers.values():
            if q.get("gpu") and o["gpu"] != q["gpu"]:
                continue
            if q.get("region") and o["region"] != q["region"]:
                continue
            if q.get("max_usd_per_hour") and o["usd_per_hour"] > float(q["max_usd_per_hour"]):
                continue
            out.append(dict(o))
        return 200, {"offers": out}

    def api_request(self, body: dict[str, Any]) -> tuple[int, Any]:
        n = self.counts["requests"]
        self.counts["requests"] += 1
        offer = self.offers.get(str(body.get("offer_id")))
        if offer is None:
            return _err(404, "not_found", f"no offer {body.get('offer_id')!r}")
        cmd = body.get("command")
        dur = body.get("duration_s")
        if not isinstance(cmd, list) or not cmd or not isinstance(dur, (int, float)) or dur <= 0:
            return _err(400, "bad_request", "command (a non-empty list) and duration_s > 0")
        cap = body.get("max_usd_per_hour")
        if cap is not None and offer["usd_per_hour"] > float(cap):
            return _err(422, "over_price", f"{offer['id']} costs {offer['usd_per_hour']}/h")
        if offer["available"] <= 0 or self._rng("req", n).random() < float(
            self.scenario.get("refuse_p", 0.0)
        ):
            self.counts["refused"] += 1
            return _err(409, "no_capacity", f"no {offer['gpu']} free in {offer['region']} now")
        number = self.counts["leases"]
        self.counts["leases"] += 1
        lease = _Lease(number, f"lease-{number:05d}", offer, body)
        lease.expires_at = lease.created_at + min(float(dur), self._max_duration())
        self._plan(lease)
        offer["available"] -= 1
        self.leases[lease.id] = lease
        return 201, lease.view()

    def _max_duration(self) -> float:
        return float(self.scenario.get("max_duration_s", 3600.0))

    def api_list(self, q: dict[str, str]) -> tuple[int, Any]:
        return 200, {"leases": [x.view() for x in self._labelled(q.get("label"))]}

    def _labelled(self, label: Optional[str]) -> list[_Lease]:
        if not label:
            return list(self.leases.values())
        k, _, v = label.partition("=")
        return [x for x in self.leases.values() if (x.req.get("labels") or {}).get(k) == v]

    def api_get(self, lid: str) -> tuple[int, Any]:
        lease = self.leases.get(lid)
        return (200, lease.view()) if lease else _err(404, "not_found", f"no lease {lid!r}")

    def api_renew(self, lid: str, body: dict[str, Any]) -> tuple[int, Any]:
        lease = self.leases.get(lid)
        if lease is None:
            return _err(404, "not_found", f"no lease {lid!r}")
        if lease.state in TERMINAL or lease.renew_refused:
            self.counts["renew_refused"] += 1
            return _err(409, "not_renewable", f"lease {lid} ({lease.state}) cannot be renewed")
        dur = float(body.get("duration_s", 0))
        if dur <= 0:
            return _err(400, "bad_request", "duration_s must be > 0")
        lease.expires_at = time.time() + min(dur, self._max_duration())
        self.counts["renewed"] += 1
        return 200, lease.view()

    def api_release(self, lid: str) -> tuple[int, Any]:
        lease = self.leases.get(lid)
        if lease is None:
            return _err(404, "not_found", f"no lease {lid!r}")
        if lease.state not in TERMINAL:
            self._end(lease, "released", time.time(), term=True)
        return 200, lease.view()

    def evict(self, lid: str, grace_s: float = 0.0) -> tuple[int, Any]:
        """Evict a running lease now (``grace_s`` 0) or after a notice of ``grace_s``
        seconds; replaces its planned eviction. A second call with ``grace_s`` 0 after a
        notice evicts at once (counted with notice). Call under the lock (or over HTTP)."""
        lease = self.leases.get(lid)
        if lease is None:
            return _err(404, "not_found", f"no lease {lid!r}")
        if lease.state not in ("running", "evicting") or lease.started_at is None:
            return _err(409, "not_running", f"lease {lid} is {lease.state}: nothing to evict")
        if not (isinstance(grace_s, (int, float)) and 0 <= grace_s <= self._max_duration()):
            return _err(
                400, "bad_request", f"grace_s must be in [0, max_duration_s], not {grace_s!r}"
            )
        now = time.time()
        lease.evict_progress = None
        if lease.eviction is not None:  # noticed before: the eviction comes now
            lease.eviction["evict_at"] = now
            lease.evict_plan = (now - lease.started_at, float(lease.eviction["grace_s"]))
        else:
            lease.evict_plan = (now - lease.started_at + float(grace_s), float(grace_s))
        return 200, lease.view()

    def api_billing(self, q: dict[str, str]) -> tuple[int, Any]:
        now = time.time()
        leases = self._labelled(q.get("label"))
        if q.get("lease_id"):
            leases = [x for x in leases if x.id == q["lease_id"]]
        return 200, {"now": now, "records": [x.bill(now) for x in leases]}

    # -- the clock -------------------------------------------------------------------

    def _run_ticks(self) -> None:
        while not self._stop.wait(self.tick_s):
            with self._lock:
                self.tick(time.time())

    def tick(self, now: float) -> None:
        """Start pending leases, give notices, evict, expire, reap (under the lock)."""
        delay = float(self.scenario.get("start_delay_s", 0.1))
        for lease in list(self.leases.values()):
            if lease.state in TERMINAL:
                if lease.kill_at is not None and now >= lease.kill_at:
                    self._kill(lease, signal.SIGKILL)
                    lease.kill_at = None
                continue
            if lease.state == "pending" and now >= lease.created_at + delay:
                self._spawn(lease, now)
            if lease.state in ("running", "evicting") and lease.proc.poll() is not None:
                lease.state, lease.exit_code = "exited", lease.proc.returncode
            if lease.evict_progress is not None and lease.state == "running":
                if lease.eviction is None and now - lease.progress_at >= self.progress_poll_s:
                    lease.progress_at = now
                    assert self.progress is not None
                    lease.progress = int(self.progress(dict(lease.req.get("env") or {})))
                    if lease.progress >= lease.evict_progress:
                        # the plan's time becomes "now + grace" (notice now)
                        lease.evict_plan = (
                            now - lease.started_at + lease.evict_plan[1],
                            lease.evict_plan[1],
                        )
                        lease.evict_progress = None
            if (
                lease.evict_plan is not None
                and lease.started_at is not None
                and lease.evict_progress is None
            ):
                after, grace = lease.evict_plan
                evict_at = lease.started_at + after
                if lease.eviction is None and now >= evict_at - grace:
                    lease.eviction = {"notice_at": now, "grace_s": grace, "evict_at": evict_at}
                    if lease.state == "running":
                        lease.state = "evicting"
                if now >= evict_at:
                    self.counts["evicted"] += 1
                    self.counts["evicted_without_notice"] += grace == 0
                    self._end(lease, "evicted", now)
                    continue
            if now >= lease.expires_at:
                self.counts["expired"] += 1
                self._end(lease, "expired", now)

    def _spawn(self, lease: _Lease, now: float) -> None:
        cwd = self.work_dir / lease.id
        cwd.mkdir(parents=True, exist_ok=True)
        # a node's own environment (this machine's: its Python finds the same sources,
        # PYTHONPATH included) + the lease's
        own = ("PATH", "HOME", "LANG", "PYTHONPATH")
        base = {k: os.environ[k] for k in own if k in os.environ}
        env = {**base, **(lease.req.get("env") or {})}
        env["NC_LEASE_ID"] = lease.id
        with open(cwd / "output.log", "ab") as log:
            lease.proc = subprocess.Popen(
                [str(c) for c in lease.req["command"]],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        lease.state, lease.started_at = "running", now

    def _end(self, lease: _Lease, state: str, now: float, term: bool = False) -> None:
        lease.state, lease.ended_at = state, now
        self.offers[lease.offer["id"]]["available"] += 1
        if state == "released":
            self.counts["released"] += 1
        if term:  # a release: SIGTERM now, SIGKILL after 5 s
            self._kill(lease, signal.SIGTERM)
            lease.kill_at = now + 5.0
        else:  # the marketplace reclaims the node
            self._kill(lease, signal.SIGKILL)

    @staticmethod
    def _kill(lease: _Lease, sig: int) -> None:
        if lease.proc is None:
            return
        try:
            os.killpg(lease.proc.pid, sig)
        except ProcessLookupError:
            pass
        lease.proc.poll()

    def billing_usd(self, label: Optional[str] = None) -> dict[str, float]:
        """Billed USD per lease id (the records' ``usd``)."""
        with self._lock:
            now = time.time()
            return {x.id: x.bill(now)["usd"] for x in self._labelled(label)}


class BufferProgress:
    """``progress(env)`` for :class:`Marketplace`: groups the lease's island incarnation
    appended to a run's buffer (a ``dir`` store with the ``jsonl`` index), read
    incrementally from ``<store>/buffer/index.jsonl``.

    :param store_root: the run's store directory (``<run_dir>/store``).
    """

    def __init__(self, store_root: str | os.PathLike[str]) -> None:
        self.path = Path(store_root) / "buffer" / "index.jsonl"
        self.offset = 0
        self.counts: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def __call__(self, env: Mapping[str, str]) -> int:
        with self._lock:
            self._read()
            key = (env.get("YETO_ISLAND", ""), int(env.get("YETO_INCARNATION", "-1")))
            return self.counts.get(key, 0)

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # only whole lines
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line)
                key = (str(rec["host"]), int(rec["incarnation"]))
            except (ValueError, KeyError, TypeError):
                continue
            self.counts[key] = self.counts.get(key, 0) + 1
        self.offset += end


def _err(status: int, code: str, message: str) -> tuple[int, Any]:
    return status, {"error": {"code": code, "message": message}}


def _handler(market: Marketplace) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> None:
            u = urlparse(self.path)
            q = {k: v[0] for k, v in parse_qs(u.query).items()}
            parts = [p for p in u.path.split("/") if p]
            body: dict[str, Any] = {}
            if method == "POST":
                n = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(n) or b"{}")
                except ValueError:
                    return self._send(*_err(400, "bad_request", "the body is not JSON"))
            with market._lock:
                if parts == ["v1", "offers"] and method == "GET":
                    out = market.api_offers(q)
                elif parts == ["v1", "leases"] and method == "POST":
                    out = market.api_request(body)
                elif parts == ["v1", "leases"] and method == "GET":
                    out = market.api_list(q)
                elif len(parts) == 3 and parts[:2] == ["v1", "leases"] and method == "GET":
                    out = market.api_get(parts[2])
                elif len(parts) == 3 and parts[:2] == ["v1", "leases"] and method == "DELETE":
                    out = market.api_release(parts[2])
                elif parts[:2] == ["v1", "leases"] and parts[3:] == ["renew"] and method == "POST":
                    out = market.api_renew(parts[2], body)
                elif parts == ["v1", "billing"] and method == "GET":
                    out = market.api_billing(q)
                elif parts[:2] == ["sim", "leases"] and parts[3:] == ["evict"] and method == "POST":
                    out = market.evict(parts[2], body.get("grace_s", 0.0))
                else:
                    out = _err(404, "not_found", f"no route {method} {u.path}")
            self._send(*out)

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_DELETE(self) -> None:
            self._route("DELETE")

    return Handler


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m yeto_nc.testing [SCENARIO.json]``: serve a simulator until Ctrl-C or SIGTERM.

    Prints ``YETO_NC_URL=http://127.0.0.1:PORT`` (export it for ``yeto run up``) and,
    at the end, the storm's counts and the billed USD per lease as JSON.
    """
    import argparse

    ap = argparse.ArgumentParser(prog="python -m yeto_nc.testing", description=main.__doc__)
    ap.add_argument("scenario", nargs="?", help="a scenario JSON file (default: calm)")
    ap.add_argument("--work-dir", help="where lease processes run (default: a temp dir)")
    ap.add_argument(
        "--store",
        help="the run's store directory (<run_dir>/store): evict_after_progress counts "
        "the groups each node appended there",
    )
    args = ap.parse_args(argv)
    progress = BufferProgress(args.store) if args.store else None
    market = Marketplace(args.scenario, work_dir=args.work_dir, progress=progress)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"YETO_NC_URL={market.start()}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        market.stop()
        print(json.dumps({"counts": market.counts, "usd": market.billing_usd()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
