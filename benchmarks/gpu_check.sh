#!/usr/bin/env bash
# Every check of whyidle that needs a real NVIDIA GPU, in one script (see ../shared/device/README.md).
#
#   bash benchmarks/gpu_check.sh            # on a GPU machine, from any directory
#
# Runs from source (PYTHONPATH=src, nothing installed) with the Python that has PyTorch
# ($PYTHON, else python3, else python). Needs PyTorch with CUDA, nvidia-ml-py, psutil, rich, click,
# numpy; no network. Results go to $OUT if set, else ./gpu_check_out:
#
#   env.txt                     GPU, driver, torch/CUDA versions
#   pytest_gpu.{out,err}        python -m pytest -m gpu (tests/test_gpu_real.py, the NVML poller test)
#   c09_faulty.json ...         whyidle run --json reports of the GPU variants of the field cases
#   runs/<case>/                their run directories;  <case>.{out,err}: the commands' output
#   probe/nvml_probe.json       .device/nvml_probe.py;  probe_demo/nvml_probe.json: with --demo
#   demo.{out,err}              whyidle demo on CUDA (skipped without pillow + scikit-learn)
#   summary.txt, summary.json   the table printed last;  log.txt, status.txt: what ran, rc, seconds
#
# The NVML probe lives in the git-ignored folder .device/ (a copy of ../shared/device/nvml_probe.py),
# and .device/pylib/ holds pytest for machines without it: when the machine receives the repository
# through a tool that copies only tracked files, carry .device along. benchmarks/overhead.py is not
# run: it has no device option (its workload is a CPU loop), so it would measure nothing about GPUs.
#
# Every command is bounded with `timeout`, and the whole script keeps to GPU_CHECK_BUDGET_S
# (default 330 s; about 4-5 minutes on one H200): a step that no longer fits is skipped and
# says so. Exit code: 0 when every step that ran passed, 1 otherwise, 2 when there is no usable GPU.
# GPU_CHECK_DEVICE=cpu is a dry run of the plumbing on a machine without a GPU (the cases on the CPU).

set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
RES=${OUT:-$ROOT/gpu_check_out}
mkdir -p "$RES/runs"
: > "$RES/status.txt"
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-330}
FAILED=0
DEVICE=${GPU_CHECK_DEVICE:-cuda}

log() { echo "[gpu_check +$(( $(date +%s) - START ))s] $*" | tee -a "$RES/log.txt" >&2; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }

# step NAME LIMIT_S CMD...: runs CMD with stdout/stderr in $RES/NAME.{out,err}, bounded by
# min(LIMIT_S, time left); records "NAME rc seconds" in status.txt.
step() {
    local name=$1 limit=$2
    shift 2
    local l
    l=$(left)
    if (( l < 20 )); then
        log "SKIP $name: the time budget is spent"
        echo "$name skipped budget" >> "$RES/status.txt"
        return 0
    fi
    (( limit > l )) && limit=$l
    log "RUN  $name (at most ${limit}s): $*"
    local t0 rc
    t0=$(date +%s)
    timeout -k 10 "$limit" "$@" > "$RES/$name.out" 2> "$RES/$name.err"
    rc=$?
    local dt=$(( $(date +%s) - t0 ))
    if (( rc == 124 || rc == 137 )); then
        log "TIMEOUT $name after ${dt}s"
    elif (( rc != 0 )); then
        log "FAIL $name rc=$rc after ${dt}s (tail of $name.err below)"
        tail -n 15 "$RES/$name.err" >&2
    else
        log "ok   $name (${dt}s)"
    fi
    (( rc != 0 )) && FAILED=1
    echo "$name $rc $dt" >> "$RES/status.txt"
    return 0
}

# -- Python and environment ------------------------------------------------------------------------
PY=${PYTHON:-}
if [[ -z $PY ]]; then
    for cand in python3 python; do
        if command -v "$cand" > /dev/null && "$cand" -c "import torch" 2> /dev/null; then PY=$cand; break; fi
    done
fi
if [[ -z $PY ]]; then
    log "no Python with PyTorch found (set PYTHON=...)"
    exit 2
fi
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import pytest" 2> /dev/null && [[ -d $ROOT/.device/pylib ]]; then
    export PYTHONPATH="$PYTHONPATH:$ROOT/.device/pylib"   # pytest brought along
fi
export PYTHONUNBUFFERED=1

{
    echo "date: $(date -u +%FT%TZ)"
    echo "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
    timeout 60 "$PY" - << 'EOF'
import warnings
warnings.simplefilter("ignore")
import torch
print("torch", torch.__version__, "cuda build", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", torch.cuda.get_device_name(0), "cc", f"{p.major}.{p.minor}", "memory_GiB", round(p.total_memory / 2**30, 1),
          "count", torch.cuda.device_count())
for mod in ("pynvml", "psutil", "rich", "click", "numpy", "pytest", "PIL", "sklearn"):
    try:
        m = __import__(mod)
        print(mod, getattr(m, "__version__", "?"))
    except Exception as exc:
        print(mod, "MISSING", type(exc).__name__)
EOF
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv 2>&1
} > "$RES/env.txt" 2>&1
cat "$RES/env.txt" >&2
if [[ $DEVICE == cuda ]] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    log "PyTorch cannot use CUDA here: nothing to check (see env.txt)"
    exit 2
fi

# -- 1. the field cases' GPU variants under whyidle run --------------------------------------------
S=$ROOT/tests/scenarios
whyidle_run() {  # whyidle_run CASE LIMIT SCRIPT ARGS...
    local name=$1 limit=$2
    shift 2
    rm -rf "$RES/runs/$name" "$RES/$name.json"
    step "$name" "$limit" "$PY" -m whyidle run -q --out "$RES/runs/$name" --json "$RES/$name.json" -- \
        "$PY" "$@" --device "$DEVICE"
}
whyidle_run c09_faulty 90 "$S/c09_item_sync.py" --variant faulty
whyidle_run c09_fixed 90 "$S/c09_item_sync.py" --variant fixed
whyidle_run c09_faulty_step 90 "$S/c09_item_sync.py" --variant faulty --read-at step  # reads after optimizer.step()
whyidle_run c23_faulty 90 "$S/c23_model_on_cpu.py" --variant faulty
whyidle_run c21_faulty_big 120 "$S/c21_pageable_copy.py" --variant faulty --big
whyidle_run c21_fixed_big 120 "$S/c21_pageable_copy.py" --variant fixed --big
# torch.compile on the GPU: recompilations at new lengths (aot_eager: no Triton code generation)
whyidle_run compile_varlen 120 "$S/compile_varlen.py" --backend aot_eager --steps 60
# whyidle.watch() inside the program (issue 33): the sampler helper's NVML, the hooks out afterwards
rm -rf "$RES/runs/watch_block" "$RES/watch_block.json"
step watch_block 90 "$PY" "$S/watch_block.py" --device "$DEVICE" --out "$RES/runs/watch_block" --json "$RES/watch_block.json"

# -- 2. GPU-marked tests ------------------------------------------------------------------------------
if "$PY" -c "import pytest" 2> /dev/null; then
    # only the files with GPU tests: collecting the others imports packages a GPU machine may lack
    # (msgspec, TensorFlow), which fails the collection before any GPU test runs
    step pytest_gpu 200 "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider $(grep -l "mark.gpu" tests/test_*.py)
else
    log "SKIP pytest_gpu: pytest is missing and .device/pylib was not carried along"
    echo "pytest_gpu skipped no-pytest" >> "$RES/status.txt"
fi

# -- 3. NVML probe ---------------------------------------------------------------------------------------
PROBE=$ROOT/.device/nvml_probe.py
if [[ -f $PROBE ]]; then
    mkdir -p "$RES/probe" "$RES/probe_demo"
    step probe 75 env OUT="$RES/probe" "$PY" "$PROBE"
    step probe_demo 90 env OUT="$RES/probe_demo" "$PY" "$PROBE" --demo
else
    log "MISSING $PROBE: the NVML probe was not run. Copy ../shared/device/nvml_probe.py to .device/ and carry .device along."
    echo "probe missing" >> "$RES/status.txt"
    FAILED=1
fi

# -- 4. the demo on CUDA (last: it needs pillow and scikit-learn, which a GPU machine may lack) --------
if (( $(left) < 90 )); then
    log "SKIP demo: less than 90 s of the time budget left"
    echo "demo skipped budget" >> "$RES/status.txt"
elif "$PY" -c "import PIL, sklearn" 2> /dev/null; then
    step demo 120 "$PY" -m whyidle demo --out "$RES/runs/demo"
else
    log "SKIP demo: pillow or scikit-learn is missing on this machine"
    echo "demo skipped no-pillow-or-sklearn" >> "$RES/status.txt"
fi

log "SKIP overhead: benchmarks/overhead.py has no device option (a CPU workload only)"
echo "overhead skipped no-device-option" >> "$RES/status.txt"

# -- 5. the table ----------------------------------------------------------------------------------------
timeout 60 "$PY" - "$RES" << 'EOF'
import json, os, sys

res = sys.argv[1]
cases = ["c09_faulty", "c09_fixed", "c09_faulty_step", "c23_faulty", "c21_faulty_big", "c21_fixed_big",
         "compile_varlen", "watch_block"]


def script_result(name):
    try:
        with open(os.path.join(res, name + ".out")) as f:
            lines = [ln for ln in f if ln.startswith("RESULT ")]
        return json.loads(lines[-1][7:]) if lines else {}
    except Exception:
        return {}


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


rows, out = [], {}
for name in cases:
    path = os.path.join(res, name + ".json")
    if not os.path.exists(path):
        rows.append((name, "(no report)", "-", "-", "-", "-", "-"))
        continue
    with open(path) as f:
        r = json.load(f)
    m = r.get("metrics") or {}
    gpu = m.get("gpu") or {}
    by = gpu.get("idle_s_by_cause") or {}
    syncs = gpu.get("syncs") or {}
    sps = m.get("samples_per_s")
    src = ""
    if sps is None:
        sps, src = script_result(name).get("samples_per_s"), "*"
    ids = ",".join(f"{f['id']}:{f['severity'][0]}" + (f"/{f['evidence']['kind']}" if f["evidence"].get("kind") else "")
                   for f in r.get("findings") or [])
    idle = " ".join(f"{k} {v:.2f}s" for k, v in by.items() if v) or "-"
    rows.append((name, r.get("verdict"), fmt(gpu.get("idle_share"), ".0%"), idle, fmt(syncs.get("per_step"), ".2f"),
                 fmt(sps, ".0f") + src, ids))
    pt = next((f["evidence"] for f in r.get("findings") or [] if f["id"] == "pageable_transfers"), None)
    sb = next((f for f in r.get("findings") or [] if f["id"] == "sync_bound"), None)
    out[name] = {"verdict": r.get("verdict"), "findings": ids, "samples_per_s": sps, "gpu_idle_share": gpu.get("idle_share"),
                 "idle_s_by_cause": by, "syncs_per_step": syncs.get("per_step"),
                 "sync_sites": [(s.get("site"), s.get("op"), s.get("per_step")) for s in (syncs.get("sites") or [])[:4]],
                 "util_mean": gpu.get("util_mean"), "sm_active_mean": gpu.get("sm_active_mean"),
                 "pageable": pt and {k: pt.get(k) for k in ("pageable_bytes_per_step", "pageable_host_s_per_step",
                                                           "share_of_step")},
                 "sync_bound": sb and {"severity": sb["severity"], "est_speedup": sb["est_speedup"],
                                       **{k: sb["evidence"].get(k) for k in ("idle_share", "idle_s", "per_step")}},
                 "idle_share_by_cause": gpu.get("idle_share_by_cause"),
                 "script_result": script_result(name)}

head = ("case", "verdict", "GPU starved", "idle by cause", "syncs/step", "samples/s", "findings (id:severity/kind)")
widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in (head, *rows)]
status = open(os.path.join(res, "status.txt")).read().split("\n")
lines += ["", "steps (name rc seconds):"] + ["  " + s for s in status if s]
lines += ["", "* samples/s from the script's own RESULT line (no DataLoader batch size for whyidle)"]
text = "\n".join(lines)
with open(os.path.join(res, "summary.txt"), "w") as f:
    f.write(text + "\n")
with open(os.path.join(res, "summary.json"), "w") as f:
    json.dump(out, f, indent=1)
print(text)
EOF

log "done in $(( $(date +%s) - START ))s; results in $RES"
exit $FAILED
