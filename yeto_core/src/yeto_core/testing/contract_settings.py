"""The Hypothesis settings every port contract runs under (few examples, no deadline:
a contract builds real implementations, some of them slow to start)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

_SETTINGS = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.differing_executors,
    ],
)
