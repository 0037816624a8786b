"""What an island's cluster costs per hour: SkyPilot's catalog, else a dated table.

The estimate comes from SkyPilot's local catalog when it holds the cloud
(``~/.sky/catalogs/<version>/<cloud>/vms.csv``: the cheapest instance with the
accelerators in the region, its ``Price`` or ``SpotPrice``). Without a local
catalog it comes from :data:`TABLE`, a short table of list prices dated
:data:`TABLE_DATE`. The config's ``price_per_hour`` of the group overrides
both; it is what the cost ledger and the budget backstop use.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping
from typing import Optional

import attrs

from yeto_sky.tasks import IslandTask, catalog_path

#: When the table below was written (list prices change; check yours).
TABLE_DATE = "2025-06"
#: Dollars per accelerator-hour (on-demand, spot), approximate public list prices of
#: single-GPU-per-instance offerings on AWS/GCP/Lambda at TABLE_DATE. Estimates only.
TABLE: Mapping[str, tuple[float, float]] = {
    "H200": (4.50, 2.00),
    "H100": (3.90, 1.70),
    "A100-80GB": (2.50, 1.10),
    "A100": (2.00, 0.90),
    "L40S": (1.50, 0.60),
    "A10G": (1.01, 0.40),
    "L4": (0.81, 0.30),
    "T4": (0.53, 0.20),
    "V100": (3.06, 0.92),
}
#: A node without accelerators (4 vCPUs, 16 GiB).
CPU_NODE: tuple[float, float] = (0.19, 0.07)


@attrs.frozen
class Price:
    """An estimated price and where it came from."""

    per_hour: float
    source: str  # "catalog <cloud>/vms.csv <region> <instance>" or "table <date>"


def _cloud_and_region(infra: str) -> tuple[Optional[str], Optional[str]]:
    parts = [p for p in infra.split("/") if p]
    cloud = parts[0].lower() if parts else None
    region = parts[1] if len(parts) > 1 else None
    return cloud, region


def _float(raw: Optional[str]) -> Optional[float]:
    try:
        return float(raw) if raw not in (None, "") else None
    except ValueError:
        return None


def from_catalog(task: IslandTask, clouds: Optional[list[str]] = None) -> Optional[Price]:
    """The cheapest matching offering in the local catalogs, or None."""
    cloud, region = _cloud_and_region(task.infra)
    candidates = [cloud] if cloud else (clouds or ["aws", "gcp", "azure", "lambda", "nebius"])
    column = "SpotPrice" if task.use_spot else "Price"
    best: Optional[Price] = None
    for c in candidates:
        path = catalog_path(f"{c}/vms.csv")
        if not os.path.isfile(path):
            continue
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if region and (row.get("Region") or "").lower() != region.lower():
                    continue
                if not _matches(row, task.accelerators):
                    continue
                price = _float(row.get(column))
                if price is None:
                    continue
                if best is None or price < best.per_hour:
                    where = f"{c}/vms.csv {row.get('Region', '')} {row.get('InstanceType', '')}"
                    kind = "spot" if task.use_spot else "on-demand"
                    best = Price(price, f"SkyPilot catalog {where} ({kind})")
    return best


def _matches(row: Mapping[str, str], accelerators: Mapping[str, float]) -> bool:
    name = (row.get("AcceleratorName") or "").strip()
    if not accelerators:
        return name == "" and (_float(row.get("vCPUs")) or 0) >= 4
    ((acc, count),) = list(accelerators.items())[:1]
    return name.lower() == acc.lower() and _float(row.get("AcceleratorCount")) == float(count)


def from_table(task: IslandTask) -> Optional[Price]:
    """The dated table's estimate (per accelerator times the count), or None."""
    kind = "spot" if task.use_spot else "on-demand"
    if not task.accelerators:
        return Price(CPU_NODE[task.use_spot], f"table {TABLE_DATE} (CPU node, {kind})")
    total = 0.0
    for acc, count in task.accelerators.items():
        key = next((k for k in TABLE if k.lower() == acc.lower()), None)
        if key is None:
            return None
        total += TABLE[key][task.use_spot] * float(count)
    return Price(round(total, 4), f"table {TABLE_DATE} ({kind}, estimate)")


def estimate(task: IslandTask) -> Optional[Price]:
    """The catalog's price when the catalog is local, else the table's, else None."""
    return from_catalog(task) or from_table(task)
