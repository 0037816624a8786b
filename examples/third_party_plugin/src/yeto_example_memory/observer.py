"""A ``yeto_event`` observer: every event, as one JSON line, to the file ``YETO_EXAMPLE_EVENTS``.

It runs in every process of a run that has this plugin installed (the head and
each island), so the file collects the events of every stream. Without the
variable it keeps the events of this process in :data:`SEEN` (tests).
"""

from __future__ import annotations

import json
import os

#: Events seen by this process when ``YETO_EXAMPLE_EVENTS`` is not set.
SEEN: list = []


def observe(event) -> None:
    path = os.environ.get("YETO_EXAMPLE_EVENTS")
    if not path:
        SEEN.append(event)
        return
    line = json.dumps(
        {"kind": event.kind, "source": event.source, "time": event.time, "pid": os.getpid()},
        sort_keys=True,
    )
    with open(path, "a") as f:  # one short write per line: O_APPEND keeps lines whole
        f.write(line + "\n")
