"""A stand-in island for provider tests: reports what it was given, then waits."""

import os
import signal
import sys
import time

print(f"probe {os.environ.get('YETO_ISLAND')} i{os.environ.get('YETO_INCARNATION')}", flush=True)
print("cwd-entries", len(os.listdir(".")), flush=True)
print("env", ",".join(sorted(k for k in os.environ if k.startswith("YETO_"))), flush=True)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
if os.environ.get("PROBE_EXIT"):
    sys.exit(int(os.environ["PROBE_EXIT"]))
while True:
    time.sleep(0.1)
