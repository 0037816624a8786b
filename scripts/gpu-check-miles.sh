#!/usr/bin/env bash
# GPU smoke check of the miles trainer backend: a few rounds of a small model through
# `yeto run up` with backend = "miles", on a GPU machine where Miles is installed (its
# docker image, with yeto-core, yeto-miles and yeto-torch pip-installed into the same
# Python). Prints the doctor's verdict and the run's figures as JSON.
#
#   MODEL_DIR=/models/Qwen2.5-0.5B-Instruct scripts/gpu-check-miles.sh
#
# Environment:
#   MODEL_DIR   (required) a local HF checkpoint of a small model
#   MILES_DIR   Miles' checkout with train.py (default /root/miles)
#   MILES_ARGS  Miles/Megatron flags for the model and the GPUs (default below: one GPU,
#               Megatron bridge mode; a starting point, not verified on hardware yet)
#   ROUNDS      trainer.total_rounds (default 4); N_GROUPS (groups per round, default 4)
#   ENGINE      sampler engine (default hf); OUT (default a fresh temp dir)
#   TIMEOUT_S   wall-clock backstop of the run (default 1800)
set -euo pipefail

: "${MODEL_DIR:?set MODEL_DIR to a local HF checkpoint of a small model}"
MILES_DIR=${MILES_DIR:-/root/miles}
ROUNDS=${ROUNDS:-4}
N_GROUPS=${N_GROUPS:-4}
ENGINE=${ENGINE:-hf}
TIMEOUT_S=${TIMEOUT_S:-1800}
OUT=${OUT:-$(mktemp -d)/miles-gpu-check}
MILES_ARGS=${MILES_ARGS:---megatron-to-hf-mode bridge --actor-num-nodes 1 --actor-num-gpus-per-node 1 --advantage-estimator grpo --lr 1e-6 --micro-batch-size 1}
mkdir -p "$OUT"

echo "== machine"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python -c "import miles, yeto_miles, yeto_core; print('miles at', miles.__path__[0])"
test -f "$MILES_DIR/train.py" || { echo "no train.py in MILES_DIR=$MILES_DIR" >&2; exit 2; }

echo "== yeto miles doctor"
doctor_rc=0
yeto miles doctor | tee "$OUT/doctor.txt" || doctor_rc=$?

args_toml=$(python - "$MILES_ARGS" <<'PY'
import json, shlex, sys
print(json.dumps(shlex.split(sys.argv[1])))
PY
)
cat > "$OUT/run.toml" <<TOML
name = "miles-gpu-check"
run_dir = "$OUT/run"
seed = 0
[model]
path = "$MODEL_DIR"
[task]
name = "sort4"
[[samplers]]
engine = "$ENGINE"
group_size = 4
prompts_per_call = 4
backlog_cap = $((N_GROUPS * 4))
[samplers.sampling]
max_new_tokens = 16
[trainer]
backend = "miles"
groups_per_round = $N_GROUPS
max_policy_age = 3
total_rounds = $ROUNDS
[trainer.backend_options]
miles_dir = "$MILES_DIR"
miles_args = $args_toml
[scheduler]
name = "always-on"
[backstops]
wall_clock_s = $TIMEOUT_S
TOML

echo "== dry run (the exact Miles command line)"
yeto run up "$OUT/run.toml" --dry-run | tee "$OUT/dry-run.txt"

echo "== run"
t0=$(date +%s)
run_rc=0
yeto run up "$OUT/run.toml" > "$OUT/run.txt" 2>&1 || run_rc=$?
t1=$(date +%s)
tail -20 "$OUT/run.txt"

echo "== figures"
python - "$OUT" "$run_rc" "$doctor_rc" "$((t1 - t0))" <<'PY'
import json, sys
from pathlib import Path
from yeto_core.events.stream import read_events
from yeto_core.buffer.ledger import BatchLedger
from yeto_core.stores.dir_store import DirStore

out, run_rc, doctor_rc, wall = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
run = out / "run"
summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
store = DirStore(run / "store")
rounds = [e.data for e in read_events(store, "trainer") if e.kind == "round_trained" and e.data.get("positions")]
round_s = [r.get("metrics", {}).get("miles_round_s") for r in rounds]
try:
    ledger = BatchLedger(store).check()
except Exception as exc:  # report, do not hide
    ledger = {"error": str(exc)}
print(json.dumps({
    "run_exit": run_rc, "doctor_exit": doctor_rc, "wall_s": wall,
    "trained_rounds": len(rounds), "miles_round_s": round_s,
    "summary": {k: summary.get(k) for k in ("groups_appended", "groups_trained", "groups_skipped",
                "releases_published", "sampler_versions_loaded", "reward_first", "reward_last")},
    "ledger": ledger,
}, indent=1))
PY
exit $((run_rc || doctor_rc))
