"""Modal's dated price table and the $/hour of one island function."""

from __future__ import annotations

import datetime

import pytest

from yeto_core.errors import ConfigError
from yeto_modal.prices import PRICES_DATE, PRICES_USD_PER_S, hourly_usd, parse_gpu, price_table


def test_the_table_is_dated_and_per_second():
    datetime.date.fromisoformat(PRICES_DATE)
    assert PRICES_USD_PER_S["H100"] * 3600 == pytest.approx(3.9492)
    assert PRICES_USD_PER_S["A100-80GB"] * 3600 == pytest.approx(2.4984)
    assert all(0 < v < 0.01 for v in PRICES_USD_PER_S.values())


def test_parse_gpu():
    assert parse_gpu("H100:8") == ("H100", 8)
    assert parse_gpu("a100-80gb") == ("A100-80GB", 1)
    assert parse_gpu(None) == (None, 0)
    for bad in ("H100:x", "H100:0"):
        with pytest.raises(ConfigError):
            parse_gpu(bad)


def test_hourly_price_adds_gpus_cores_and_memory():
    # 8 x H100 + 16 cores + 64 GiB
    want = (8 * 0.001097 + 16 * 0.0000131 + 64 * 0.00000222) * 3600
    assert hourly_usd("H100:8", 16, 64 * 1024) == pytest.approx(want)
    # no cpu/memory: Modal's minimum reservation is still billed
    assert hourly_usd(None) == pytest.approx((0.125 * 0.0000131 + 0.125 * 0.00000222) * 3600)
    assert hourly_usd("A10G") == hourly_usd("A10")  # an alias bills as its entry


def test_overrides_and_multiplier():
    base = hourly_usd("H100", 8, 32768)
    assert hourly_usd("H100", 8, 32768, multiplier=1.25) == pytest.approx(base * 1.25)
    cheaper = hourly_usd("H100", 8, 32768, overrides={"H100": 0.0005})
    assert cheaper == pytest.approx(base - (0.001097 - 0.0005) * 3600)
    assert price_table({"B200": 0.002})["B200"] == 0.002
    with pytest.raises(ConfigError, match="no such price"):
        price_table({"H900": 1.0})
    with pytest.raises(ConfigError, match="dollars per second"):
        price_table({"H100": -1})
    with pytest.raises(ConfigError, match="provider_options.prices.V100"):
        hourly_usd("V100")
