"""``python -m yeto_core.testing.idle_island``: an island that idles until SIGTERM (provider contracts).

It checks that its environment names a store and an island, as every island's does.
"""

from __future__ import annotations

import os
import signal
import sys
import threading


def main() -> int:
    missing = [k for k in ("YETO_STORE", "YETO_ISLAND", "YETO_INCARNATION") if k not in os.environ]
    if missing:
        print(f"idle island: missing {missing}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    stop.wait(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
