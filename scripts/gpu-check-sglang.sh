#!/usr/bin/env bash
# Run the sglang engine's tests against a REAL SGLang server and print a pass/fail table.
#
#   scripts/gpu-check-sglang.sh            # on a machine with SGLang 0.5.x installed
#
# What it does:
#   1. builds the tiny Llama (and a tiny Mixtral, for routed experts) the tests use, offline;
#   2. starts `python -m sglang.launch_server` on 127.0.0.1 for each (float32, LoRA flags,
#      --enable-return-routed-experts for the MoE model), waits for /health;
#   3. runs tests/sglang with YETO_SGLANG_URL / YETO_SGLANG_MODEL (and the MoE pair): the
#      tests taking the `target` fixture run against the real server, those that need the
#      protocol server's failure injection are skipped (and listed as such);
#   4. prints one line per test (PASS / FAIL / SKIP) and exits non-zero on any failure.
#
# Environment:
#   YETO_PYTHON      the interpreter with yeto installed (default: .venv/bin/python)
#   SGLANG_PYTHON    the interpreter with SGLang installed (default: $YETO_PYTHON)
#   SGLANG_DEVICE    cuda (default) or cpu (the CPU recipe in docs/sglang.md)
#   SGLANG_PYTHONPATH  PYTHONPATH of the server only (the CPU recipe: the cpu-stubs folder)
#   SGLANG_ATTENTION attention backend (default: torch_native, works for head_dim 32)
#   SGLANG_EXTRA     extra server flags (e.g. "--mem-fraction-static 0.3")
#   SGLANG_LORA_BACKEND  --lora-backend (default: SGLang's; torch_native on cpu)
#   YETO_SGLANG_ATOL log-prob tolerance vs transformers (default 1e-3)
#   CHECK_TIMEOUT_S  seconds to wait for each server (default 600)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
YETO_PYTHON="${YETO_PYTHON:-$ROOT/.venv/bin/python}"
SGLANG_PYTHON="${SGLANG_PYTHON:-$YETO_PYTHON}"
DEVICE="${SGLANG_DEVICE:-cuda}"
ATTN="${SGLANG_ATTENTION:-torch_native}"
TIMEOUT="${CHECK_TIMEOUT_S:-600}"
LORA_BACKEND="${SGLANG_LORA_BACKEND:-}"
CPU_FLAGS=()
if [[ "$DEVICE" == "cpu" ]]; then
  LORA_BACKEND="${LORA_BACKEND:-torch_native}"
  CPU_FLAGS=(--mem-fraction-static 0.05)
  export SGLANG_CPU_DROP_PIN_MEMORY=1 SGLANG_USE_CPU_ENGINE=1
fi
LORA_FLAGS=(--enable-lora --max-lora-rank 8 --lora-target-modules q_proj v_proj --max-loras-per-batch 4)
[[ -n "$LORA_BACKEND" ]] && LORA_FLAGS+=(--lora-backend "$LORA_BACKEND")
WORK="$(mktemp -d "${TMPDIR:-/tmp}/yeto-sglang-check.XXXXXX")"
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

env PYTHONPATH="${SGLANG_PYTHONPATH:-${PYTHONPATH:-}}" \
  "$SGLANG_PYTHON" -c "import sglang, sys; print('SGLang', sglang.__version__, 'at', sys.executable)" \
  || { echo "SGLang is not importable with $SGLANG_PYTHON; set SGLANG_PYTHON" >&2; exit 2; }

echo "== building the tiny models in $WORK"
"$YETO_PYTHON" - "$WORK" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "tests/sglang")
from conftest import save_tiny_llama, save_tiny_moe
work = Path(sys.argv[1])
save_tiny_llama(work / "tiny", seed=0)
save_tiny_moe(work / "moe", seed=3)
EOF

free_port() { "$YETO_PYTHON" -c "from yeto_core.sampler.engine_server import free_port; print(free_port())"; }

start_server() {  # name model port flags...
  local name="$1" model="$2" port="$3"; shift 3
  echo "== starting SGLang ($name) on 127.0.0.1:$port"
  # shellcheck disable=SC2086
  env PYTHONPATH="${SGLANG_PYTHONPATH:-${PYTHONPATH:-}}" \
    "$SGLANG_PYTHON" -m sglang.launch_server --model-path "$model" --tokenizer-path "$model" \
    --host 127.0.0.1 --port "$port" --device "$DEVICE" --dtype float32 \
    --attention-backend "$ATTN" --weight-version 0 --skip-server-warmup \
    --disable-cuda-graph "${CPU_FLAGS[@]}" "$@" ${SGLANG_EXTRA:-} >"$WORK/$name.log" 2>&1 &
  PIDS+=("$!")
  local deadline=$((SECONDS + TIMEOUT))
  until curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
    if ! kill -0 "${PIDS[-1]}" 2>/dev/null; then
      echo "SGLang ($name) exited; its log:" >&2; tail -40 "$WORK/$name.log" >&2; return 1
    fi
    if ((SECONDS > deadline)); then
      echo "SGLang ($name) not healthy after ${TIMEOUT}s; its log:" >&2
      tail -40 "$WORK/$name.log" >&2; return 1
    fi
    sleep 1
  done
}

P1="$(free_port)"
start_server tiny "$WORK/tiny" "$P1" "${LORA_FLAGS[@]}"
export YETO_SGLANG_URL="http://127.0.0.1:$P1" YETO_SGLANG_MODEL="$WORK/tiny"
P2="$(free_port)"
if start_server moe "$WORK/moe" "$P2" --enable-return-routed-experts; then
  export YETO_SGLANG_MOE_URL="http://127.0.0.1:$P2" YETO_SGLANG_MOE_MODEL="$WORK/moe"
else
  echo "(the MoE server did not start: the routed-experts test is skipped)"
fi

echo "== running tests/sglang against the real server(s)"
set +e
"$YETO_PYTHON" -m pytest -q -p no:cacheprovider tests/sglang/test_engine.py \
  tests/sglang/test_follow.py --junitxml="$WORK/junit.xml" -o junit_family=xunit1 \
  >"$WORK/pytest.log" 2>&1
rc=$?
set -e
tail -5 "$WORK/pytest.log"

"$YETO_PYTHON" - "$WORK/junit.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
rows = []
for case in root.iter("testcase"):
    name = case.get("name")
    if case.find("failure") is not None or case.find("error") is not None:
        status = "FAIL"
    elif case.find("skipped") is not None:
        status = "SKIP"
    else:
        status = "PASS"
    rows.append((status, name, case.get("time", "")))
width = max(len(r[1]) for r in rows)
print(f"\n{'result':6}  {'test':{width}}  seconds")
for status, name, t in rows:
    print(f"{status:6}  {name:{width}}  {float(t or 0):.1f}")
counts = {s: sum(1 for r in rows if r[0] == s) for s in ("PASS", "FAIL", "SKIP")}
print(f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
EOF
echo "logs: $WORK (pytest.log, tiny.log, moe.log)"
exit "$rc"
