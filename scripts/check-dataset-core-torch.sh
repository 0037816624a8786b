#!/usr/bin/env bash
# The install acceptance of the dataset example: a fresh venv holding only yeto-core and
# yeto-torch (wheels built from this tree, no other yeto distribution) runs
# examples/dataset/run.toml to its data end and checks what it learned and trained.
#
#   scripts/check-dataset-core-torch.sh [PYTHON]      # PYTHON: the venv's interpreter (python3)
#
# Builds the two wheels (pip wheel, no isolated build: the builder's setuptools), makes a
# venv in a temporary directory, installs torch==2.13.0 and the wheels there (their
# requirements from the package index, pinned by constraints.txt), then, from this
# checkout's root, with the venv's Python only:
#   python examples/dataset/prepare.py            (the data and the warm base, reused if there)
#   yeto run up examples/dataset/run.toml --run-dir <tmp>/run
#   yeto ledger check <tmp>/run --json
# Prints one JSON line: the installed yeto distributions, the run's wall time, [eval]'s
# held-out reward_mean at the base, the last evaluation and the mean of the last three,
# and the ledger's per-epoch counts. Exits 1 when a check fails: another yeto distribution
# installed, the run not finished at its data end, a gain under 0.2 (base to the mean of
# the last three evaluations), a wall time over 900 s, or the ledger check not ok.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${1:-python3}
BUILD_PY=${BUILD_PYTHON:-$ROOT/.venv/bin/python}
[ -x "$BUILD_PY" ] || BUILD_PY=$(command -v python)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/yeto-dataset-core-torch.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
unset PYTHONPATH  # only what the venv installed may be imported

"$BUILD_PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/wheels" \
    ./yeto_core ./plugins/yeto-torch
"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin"
PIP_CONSTRAINT="$ROOT/constraints.txt" "$V/python" -m pip install -q --disable-pip-version-check \
    'torch==2.13.0' "$WORK"/wheels/*.whl

"$V/python" examples/dataset/prepare.py
start=$(date +%s)
set +e
"$V/yeto" run up examples/dataset/run.toml --run-dir "$WORK/run" > "$WORK/run.log" 2>&1
rc=$?
set -e
wall=$(( $(date +%s) - start ))
tail -n 25 "$WORK/run.log"
set +e
"$V/yeto" ledger check "$WORK/run" --json > "$WORK/ledger.json" 2> "$WORK/ledger.err"
set -e

"$V/python" - "$WORK" "$rc" "$wall" <<'EOF'
import json
import subprocess
import sys
from pathlib import Path

work, rc, wall = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
problems = []
listed = subprocess.run(
    [str(work / "venv/bin/python"), "-m", "pip", "list", "--format=json"],
    capture_output=True, text=True, check=True,
).stdout
yeto = sorted(p["name"] for p in json.loads(listed) if p["name"].startswith("yeto"))
if yeto != ["yeto-core", "yeto-torch"]:
    problems.append(f"installed yeto distributions: {yeto}")
log = (work / "run.log").read_text()
if rc != 0 or "finished (data_end)" not in log:
    problems.append(f"yeto run up exited {rc} without finishing at its data end")
report = {"yeto_distributions": yeto, "exit": rc, "wall_s": wall}
summary = work / "run" / "summary.json"
if summary.exists():
    releases = sorted(json.loads(summary.read_text())["eval"]["releases"], key=lambda r: r["version"])
    means = [r["metrics"]["reward_mean"] for r in releases]
    end = sum(means[-3:]) / len(means[-3:])
    report["eval"] = {"base": means[0], "last": means[-1], "end_mean_of_last_3": round(end, 4),
                      "gain": round(end - means[0], 4), "evaluations": len(means)}
    if end - means[0] < 0.2:
        problems.append(f"[eval] gain {end - means[0]:.3f} < 0.2")
else:
    problems.append("no summary.json")
if wall > 900:
    problems.append(f"wall time {wall} s > 900 s")
try:
    ledger = json.loads((work / "ledger.json").read_text())
    report["ledger"] = {"ok": ledger["epochs"]["ok"], "epochs": [
        {k: e[k] for k in ("epoch", "rows", "trained", "skipped", "missing", "doubled")}
        for e in ledger["epochs"]["epochs"]
    ]}
    if not ledger["epochs"]["ok"]:
        problems.append("yeto ledger check: not ok")
except (ValueError, KeyError, OSError) as exc:
    problems.append(f"yeto ledger check gave no report: {exc}: {(work / 'ledger.err').read_text()[-500:]}")
report["ok"] = not problems
report["problems"] = problems
print(json.dumps(report))
sys.exit(0 if not problems else 1)
EOF
