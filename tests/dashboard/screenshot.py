"""Screenshot the dashboard of a run with Debian's headless chromium (how docs/dashboard.png is made).

    .venv/bin/python tests/dashboard/screenshot.py RUN OUT.png [--width 1400] [--full]

Serves ``yeto dashboard RUN --port 0``, opens it through Playwright
(``executable_path=/usr/bin/chromium``, no browser download), waits for the
first render, writes the screenshot and stops the server. Console errors are
printed and make the exit code 1.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

from playwright.sync_api import sync_playwright


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("out")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=900)
    ap.add_argument("--full", action="store_true", help="the whole page, not the first screen")
    ap.add_argument("--chromium", default=os.environ.get("YETO_CHROMIUM", "/usr/bin/chromium"))
    a = ap.parse_args()
    cmd = [
        sys.executable,
        "-c",
        "from yeto_core.cli import main; main()",
        "dashboard",
        a.run,
        "--port",
        "0",
    ]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    errors: list[str] = []
    try:
        line = server.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:\d+/", line)
        if not m:
            print(f"the dashboard did not start: {line}", file=sys.stderr)
            return 1
        with sync_playwright() as pw:
            args = ["--no-sandbox"] if os.geteuid() == 0 else []
            browser = pw.chromium.launch(executable_path=a.chromium, args=args)
            page = browser.new_page(viewport={"width": a.width, "height": a.height})
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(m.group(0))
            page.wait_for_selector("body[data-rendered='1']", timeout=60_000)
            page.screenshot(path=a.out, full_page=a.full)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    for e in errors:
        print(f"console error: {e}", file=sys.stderr)
    print(f"wrote {a.out}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
