"""The one narrow client of a GPU marketplace (the lease API of ``docs/nc-api.md``).

The ``nc`` provider calls nothing but :class:`LeaseClient`; a marketplace with
another API needs one more class with these methods (and the same return
shapes: plain dicts as the API document describes them).
"""

from __future__ import annotations

from typing import Any, Optional

import httpx

from yeto_core.errors import YetoError

#: Lease states after which nothing of the lease runs or is billed.
TERMINAL = ("released", "evicted", "expired")


class MarketplaceError(YetoError):
    """The marketplace answered with an error (``code`` as in the API document)."""

    def __init__(self, code: str, message: str, status: int = 0) -> None:
        super().__init__(f"marketplace refused ({status} {code}): {message}")
        self.code, self.status = code, status


class Refused(MarketplaceError):
    """A lease request the marketplace refused for now (capacity, rate, price)."""


class LeaseClient:
    """The lease API over HTTP (httpx).

    :param url: the marketplace's base URL (``http://127.0.0.1:PORT``).
    :param token: a bearer token, sent as ``Authorization`` when given.
    :param timeout_s: per request.
    """

    def __init__(self, url: str, *, token: Optional[str] = None, timeout_s: float = 10.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise MarketplaceError(
                "unreachable", f"{method} {self.url}{path} failed: {exc}; is the marketplace up?"
            ) from exc
        if r.status_code >= 400:
            try:
                err = r.json()["error"]
                code, message = str(err["code"]), str(err["message"])
            except (ValueError, KeyError, TypeError):
                code, message = "http_error", r.text[:200]
            cls = Refused if code in ("no_capacity", "rate_limited", "over_price") else None
            raise (cls or MarketplaceError)(code, message, r.status_code)
        return r.json()

    def offers(self, **filters: Any) -> list[dict[str, Any]]:
        """Offers, filtered by ``gpu``, ``region``, ``max_usd_per_hour`` (None: any)."""
        params = {k: v for k, v in filters.items() if v is not None}
        return list(self._call("GET", "/v1/offers", params=params)["offers"])

    def request_lease(
        self,
        offer_id: str,
        *,
        duration_s: float,
        command: list[str],
        env: dict[str, str],
        labels: dict[str, str],
        image: str = "",
        max_usd_per_hour: Optional[float] = None,
    ) -> dict[str, Any]:
        """Rent a node of ``offer_id`` running ``command``; raise :class:`Refused` when refused."""
        body: dict[str, Any] = {
            "offer_id": offer_id,
            "duration_s": duration_s,
            "command": list(command),
            "env": dict(env),
            "labels": dict(labels),
            "image": image,
        }
        if max_usd_per_hour is not None:
            body["max_usd_per_hour"] = max_usd_per_hour
        return dict(self._call("POST", "/v1/leases", json=body))

    def lease(self, lease_id: str) -> dict[str, Any]:
        """The lease's status (its ``eviction`` notice, if any)."""
        return dict(self._call("GET", f"/v1/leases/{lease_id}"))

    def leases(self, label: Optional[str] = None) -> list[dict[str, Any]]:
        """Every lease, or those with the label ``key=value``."""
        params = {"label": label} if label else {}
        return list(self._call("GET", "/v1/leases", params=params)["leases"])

    def renew(self, lease_id: str, duration_s: float) -> dict[str, Any]:
        """Extend the lease to ``now + duration_s``."""
        return dict(
            self._call("POST", f"/v1/leases/{lease_id}/renew", json={"duration_s": duration_s})
        )

    def release(self, lease_id: str) -> dict[str, Any]:
        """Ask for the lease's end (verify with :meth:`lease`: terminal and processes_gone)."""
        return dict(self._call("DELETE", f"/v1/leases/{lease_id}"))

    def billing(
        self, lease_id: Optional[str] = None, label: Optional[str] = None
    ) -> list[dict[str, Any]]:
        """Per-second billing records (of one lease, or of the leases with a label)."""
        params = {k: v for k, v in (("lease_id", lease_id), ("label", label)) if v}
        return list(self._call("GET", "/v1/billing", params=params)["records"])
