"""Modal's per-second prices, as a dated table, and the $/hour of one island function.

Modal bills a running container per second for its GPUs, CPU cores (at least 0.125)
and memory; ``provider_options.prices`` overrides entries and ``price_multiplier``
covers surcharges (docs/modal.md, "Prices and the budget").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from yeto_core.errors import ConfigError

#: When the table was read (modal.com/pricing, as quoted by dated public reports).
PRICES_DATE = "2026-06-27"

#: Dollars per second: one GPU of each type, one physical CPU core, one GiB of memory.
PRICES_USD_PER_S: dict[str, float] = {
    "B200": 0.001736,
    "H200": 0.001261,
    "H100": 0.001097,
    "RTX-PRO-6000": 0.000842,
    "A100-80GB": 0.000694,
    "A100-40GB": 0.000583,
    "L40S": 0.000542,
    "A10": 0.000306,
    "L4": 0.000222,
    "T4": 0.000164,
    "cpu_core": 0.0000131,
    "memory_gib": 0.00000222,
}

#: Names Modal accepts that bill as another entry.
ALIASES = {"A100": "A100-40GB", "A10G": "A10", "H100!": "H100", "B200+": "B200"}

#: What Modal reserves when a function names no cpu/memory (0.125 cores, 128 MiB).
DEFAULT_CPU = 0.125
DEFAULT_MEMORY_MIB = 128


def parse_gpu(gpu: Optional[str]) -> tuple[Optional[str], int]:
    """``"H100:8"`` → (``"H100"``, 8); None → (None, 0)."""
    if not gpu:
        return None, 0
    name, _, count = str(gpu).partition(":")
    try:
        n = int(count) if count else 1
    except ValueError:
        raise ConfigError(f"gpu = {gpu!r}: the count after ':' must be an integer") from None
    if n < 1:
        raise ConfigError(f"gpu = {gpu!r}: the count must be >= 1")
    return name.upper(), n


def price_table(overrides: Optional[Mapping[str, Any]] = None) -> dict[str, float]:
    """The dated table with ``overrides`` (same keys, dollars per second) applied."""
    table = dict(PRICES_USD_PER_S)
    for key, value in (overrides or {}).items():
        if key not in table:
            raise ConfigError(
                f"provider_options.prices.{key}: no such price; keys: {', '.join(sorted(table))}"
            )
        if not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"provider_options.prices.{key} = {value!r}; give dollars per second")
        table[key] = float(value)
    return table


def hourly_usd(
    gpu: Optional[str],
    cpu: Optional[float] = None,
    memory_mib: Optional[int] = None,
    *,
    overrides: Optional[Mapping[str, Any]] = None,
    multiplier: float = 1.0,
) -> float:
    """Dollars per hour of one container with ``gpu`` (``"H100:8"``), ``cpu`` cores, memory."""
    table = price_table(overrides)
    name, count = parse_gpu(gpu)
    per_s = 0.0
    if name is not None:
        key = ALIASES.get(name, name)
        if key not in table:
            raise ConfigError(
                f"gpu = {gpu!r}: no price for {name!r}; known: "
                f"{', '.join(k for k in sorted(table) if k[0].isupper())}; add it with "
                f"provider_options.prices.{name} (dollars per second)"
            )
        per_s += count * table[key]
    per_s += max(DEFAULT_CPU, float(cpu or 0.0)) * table["cpu_core"]
    per_s += max(DEFAULT_MEMORY_MIB, int(memory_mib or 0)) / 1024.0 * table["memory_gib"]
    return per_s * 3600.0 * float(multiplier)
