"""Islands whose wall clock disagrees with the head's.

The head reads every island's event stream every couple of seconds; an island
flushes its stream at least every few seconds. So the newest events the head
sees for the first time were stamped, on a correct clock, within a few seconds
before the head's own now. An island whose new events are stamped more than
``bound_s`` ahead of the head's clock, or further behind it than a stream
could have waited, runs on a skewed clock: the head records an
``island_clock_skew`` event (island, measured skew, bound) once per island and
skew episode, and ``island_clock_ok`` when it is back within the bound.

Nothing in yeto's protocol orders records by island wall clocks (positions,
versions and sequence numbers do), so a skewed island is reported, not
stopped. Pure: the head passes its clock reading in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

#: Skews within this many seconds are the flush delays of a healthy stream.
DEFAULT_BOUND_S = 60.0


class ClockSkewWatch:
    """Feeds on the islands' streams (``{island: events}``); reports skew changes."""

    def __init__(self, bound_s: float = DEFAULT_BOUND_S) -> None:
        self.bound_s = float(bound_s)
        self._seen: dict[str, int] = {}
        self._skewed: dict[str, float] = {}

    def poll(
        self, streams: Mapping[str, Sequence[Any]], now: float, *, skip: Sequence[str] = ()
    ) -> list[tuple[str, dict[str, Any]]]:
        """The ``(kind, data)`` events to record for the events added since the last poll."""
        out: list[tuple[str, dict[str, Any]]] = []
        for island, events in sorted(streams.items()):
            start = self._seen.get(island, 0)
            if len(events) < start:
                start = 0
            first_poll = island not in self._seen
            self._seen[island] = len(events)
            if island in skip or first_poll or len(events) <= start:
                continue  # the first read holds history: its times say nothing of now
            newest = max(float(e.time) for e in events[start:])
            skew = newest - now
            was: Optional[float] = self._skewed.get(island)
            if abs(skew) > self.bound_s:
                if was is None:
                    self._skewed[island] = skew
                    out.append(
                        (
                            "island_clock_skew",
                            {
                                "island": island,
                                "skew_s": round(skew, 3),
                                "bound_s": self.bound_s,
                                "message": f"{island}'s newest events are stamped {skew:+.0f} s "
                                "from the head's clock; check its host's time sync (NTP)",
                            },
                        )
                    )
            elif was is not None:
                del self._skewed[island]
                out.append(("island_clock_ok", {"island": island, "skew_s": round(skew, 3)}))
        return out
