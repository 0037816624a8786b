"""``python -m yeto_sky.real_check --infra aws``: the provider's checks on a real cloud.

Runs, against the user's SkyPilot API server and cloud, what ``tests/sky`` checks
through the double: one small CPU cluster (``yeto-check-probe-i0``) is launched
through :class:`~yeto_sky.provider.SkyIslands` with the real seam, its run
command (``python3 -m http.server``, which logs and runs until stopped) must
reach ``running``, its log must reach ``events()``, ``release`` must tear it
down verified by ``sky.status``, and ``orphans`` must then be empty. It costs
a few minutes of the cheapest CPU instance. Prints one JSON report.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    from yeto_core.records import IslandLaunch
    from yeto_sky.provider import RUNNING, SkyIslands

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--infra", required=True, help="SkyPilot infra, e.g. aws or gcp/us-central1")
    ap.add_argument("--cpus", default="2+")
    ap.add_argument("--timeout-s", type=float, default=1800.0)
    args = ap.parse_args(argv)
    state_dir = tempfile.mkdtemp(prefix="yeto-sky-check-")
    provider = SkyIslands(state_dir, poll_s=10.0)
    launch = IslandLaunch(
        run_id="yeto-check",
        store_url="",
        island="probe",
        role="sampler",
        incarnation=0,
        env={"YETO_RUN_ID": "yeto-check", "YETO_ISLAND": "probe", "YETO_INCARNATION": "0"},
        options={"resources": {"infra": args.infra, "cpus": args.cpus}, "autostop_minutes": 10},
        entry_module="http.server",
    )
    report: dict = {"infra": args.infra, "state_dir": state_dir}
    t0 = time.monotonic()
    handle = provider.launch(launch)
    report["cluster"] = handle
    deadline = t0 + args.timeout_s
    lines: list[str] = []
    try:
        while time.monotonic() < deadline and provider.status(handle) != RUNNING:
            if provider.exit_reason(handle):
                break
            time.sleep(5)
        report["running"] = provider.status(handle) == RUNNING
        report["launch_s"] = round(time.monotonic() - t0, 1)
        report["record"] = provider.record(handle)
        while report["running"] and time.monotonic() < deadline and not lines:
            lines = [e.data["line"] for e in provider.events(handle) if e.kind == "log"]
            time.sleep(5)
        report["log_lines"] = lines[:5]
    finally:
        t1 = time.monotonic()
        report["released_verified"] = provider.release(handle)
        report["release_s"] = round(time.monotonic() - t1, 1)
        report["orphans_after"] = provider.orphans()
        provider.close()
    ok = report["running"] and lines and report["released_verified"]
    report["ok"] = bool(ok) and not report["orphans_after"]
    print(json.dumps(report, indent=2, default=str))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
