#!/usr/bin/env bash
# perf/gpu_check.sh — the device check of plait's CUDA backend, on one GPU.
#
# Runs, each step under `timeout`, within a budget of about 4 minutes on an H200:
#   1. tests/cuda_device_check: every collective x type x op x placement, counts
#      0, 1, odd and ~1M, element-exact against the CPU backend (algorithm,
#      protocol, channels and chunk forced equal), with 1, 2 and 4 ranks as
#      threads sharing the GPU, then 2 ranks as processes;
#   2. the CUDA host code's moved parts (core/cuda/conn.c, plan_cache.c,
#      launch.c) and its waits (core/progress.h; proxy.c): the device check
#      again, 2 processes over sockets (PLAIT_TRANSPORT=socket: device FIFOs
#      moved by the proxy thread, which polls with the shared waiter), quick;
#      gpu_dead_peer: rank 1 killed while rank 0's kernel waits for it, over
#      CUDA IPC (the proxy's watch of its peers) and over sockets (the
#      proxy's connections): rank 0's error within 5 s, its teardown within
#      5 s; all_reduce_perf with groups of 8 operations per launch (-m 8,
#      checked): multi-op plans from the plan cache and split launches;
#   3. all_reduce_perf, all_gather_perf, reduce_scatter_perf on device buffers
#      (-D 1), ranks as threads of one process (processes sharing a GPU are
#      time-sliced): 1 and 2 ranks up to 1 GiB, 4 ranks up to 256 MiB, timing
#      only (-c 0); then each checked (-c 1) on 2 ranks up to 64 MiB;
#   4. gpu_reduce_bw: the local reduction kernel's GB/s and fraction of the
#      GPU's memory bandwidth (fp32, bf16, fp16 over 1 GiB).
# Prints a summary; exit status 0 when every step passed, 1 when one failed,
# 77 when there is no GPU (every step skipped: nothing was verified).
#
# Binaries: .gpucarry/bin of the checkout (perf/gpu_pack.sh makes it here and
# prints the device tool's command), else $PLAIT_GPU_BIN, else a build folder
# given with --bin. Shared libraries the GPU machine lacks: .gpucarry/lib.
# Logs: $OUT/gpu_check when OUT is set (the device tool brings $OUT back),
# else ./gpu_check_logs.
#
# usage: perf/gpu_check.sh [--bin DIR] [--dry-run] [--quick]
#   --dry-run  print the commands, run nothing
#   --quick    fewer types in the device check, smaller perf sweeps (a rerun that must be fast)
# GPU_CHECK_ALLOW_DOUBLE=1 with PLAIT_CUDA_LIBRARY set to the CUDA test double
# runs the script's own logic end to end without a GPU (small sizes; every
# figure is then host memory's, and the summary says "double").
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ALLOW_DOUBLE=""
[ "${GPU_CHECK_ALLOW_DOUBLE:-0}" = 1 ] && ALLOW_DOUBLE="--allow-double"
BIN=${PLAIT_GPU_BIN:-$ROOT/.gpucarry/bin}
DRY=0
QUICK=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) BIN=$2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        --quick) QUICK=1; shift ;;
        -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

# A meson build folder keeps the programs in tests/ and perf/; .gpucarry/bin
# holds them side by side.
find_bin() {
    local name=$1
    for d in "$BIN" "$BIN/perf" "$BIN/tests"; do
        if [ -x "$d/$name" ]; then echo "$d/$name"; return 0; fi
    done
    echo "$BIN/$name"
    return 1
}

LIBDIR=$ROOT/.gpucarry/lib
export LD_LIBRARY_PATH="$BIN:$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -n "${OUT:-}" ]; then LOGDIR=$OUT/gpu_check; else LOGDIR=$PWD/gpu_check_logs; fi
if [ "$DRY" = 1 ]; then
    SUMMARY=/dev/null
else
    mkdir -p "$LOGDIR"
    SUMMARY=$LOGDIR/summary.txt
    : > "$SUMMARY"
fi

# The whole script's budget: steps that would start after it are reported as
# not run (a failure), so that a slow GPU never eats the rerun's time.
BUDGET_S=${GPU_CHECK_BUDGET_S:-240}
START=$(date +%s)
FAILED=0
SKIPPED=0
RAN=0

say() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME TIMEOUT_S COMMAND...: runs one step, logs to $LOGDIR/NAME.log.
# Exit 77 from a program means "no GPU" (SKIP).
step() {
    local name=$1 limit=$2
    shift 2
    local log=$LOGDIR/$name.log
    if [ "$DRY" = 1 ]; then
        echo "[dry-run] timeout -k 5 $limit $*"
        return 0
    fi
    local now=$(( $(date +%s) - START ))
    if [ $(( now + 10 )) -gt "$BUDGET_S" ]; then
        say "$(printf '%-34s %-5s %5s  %s' "$name" FAIL "-" "not run: the ${BUDGET_S}s budget is spent")"
        FAILED=$((FAILED + 1))
        return 1
    fi
    local left=$(( BUDGET_S - now ))
    [ "$limit" -gt "$left" ] && limit=$left
    local t0=$(date +%s.%N)
    echo "\$ $*" > "$log"
    timeout -k 5 "$limit" "$@" >> "$log" 2>&1
    local rc=$?
    local dt
    dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    local status=PASS note=""
    case $rc in
        0) RAN=$((RAN + 1)) ;;
        77) status=SKIP; SKIPPED=$((SKIPPED + 1)); note="no CUDA device" ;;
        124|137) status=FAIL; FAILED=$((FAILED + 1)); note="timed out after ${limit}s" ;;
        *) status=FAIL; FAILED=$((FAILED + 1)); note="exit $rc" ;;
    esac
    # The line that says most about the step.
    local figure
    figure=$(grep -E '^[0-9]+ passed, [0-9]+ failed|Avg bus bandwidth|gpu_reduce_bw: (PASS|FAIL|SKIP)|gpu_dead_peer: (PASS|FAIL|SKIP)' "$log" | tail -1)
    say "$(printf '%-34s %-5s %5ss  %s %s' "$name" "$status" "$dt" "$figure" "${note:+($note)}")"
    if [ "$status" = FAIL ]; then
        grep -E '^FAIL|failed|error|Error' "$log" | head -5 | sed 's/^/    /' | tee -a "$SUMMARY"
    fi
    return 0
}

CHECK=$(find_bin cuda_device_check)
AR=$(find_bin all_reduce_perf)
AG=$(find_bin all_gather_perf)
RS=$(find_bin reduce_scatter_perf)
RBW=$(find_bin gpu_reduce_bw)
DP=$(find_bin gpu_dead_peer)
for b in "$CHECK" "$AR" "$AG" "$RS" "$RBW" "$DP"; do
    if [ ! -x "$b" ] && [ "$DRY" = 0 ]; then
        echo "gpu_check.sh: $b is missing: run perf/gpu_pack.sh here first (or pass --bin BUILD_DIR)" >&2
        exit 2
    fi
done

say "# plait gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname); logs in $LOGDIR"
if [ "$DRY" = 0 ]; then
    if command -v nvidia-smi > /dev/null 2>&1; then
        timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv,noheader \
            2>&1 | sed 's/^/# GPU: /' | tee -a "$SUMMARY"
    else
        say "# nvidia-smi not found"
    fi
    # No GPU: say so once and stop (nothing here can be verified).
    timeout -k 5 70 "$CHECK" --probe $ALLOW_DOUBLE > "$LOGDIR/probe.log" 2>&1
    rc=$?
    say "$(head -1 "$LOGDIR/probe.log")"
    if [ $rc -ne 0 ]; then
        say "SKIP: no CUDA device (cuda_device_check --probe: exit $rc): nothing was verified"
        exit 77
    fi
fi

if [ -n "$ALLOW_DOUBLE" ]; then
    say "# GPU_CHECK_ALLOW_DOUBLE=1: the CUDA test double, NOT a GPU: nothing here counts as run on a GPU"
fi

# Everything the device check forces: PLAIT_ALGO, PLAIT_PROTO, channels, chunk.
# Quick mode (a rerun): 3 types instead of 12.
Q=""
[ "$QUICK" = 1 ] && Q="--quick"
step device_check_threads_1 60 "$CHECK" --threads 1 $Q $ALLOW_DOUBLE --failures-only --timeout 55
step device_check_threads_2 70 "$CHECK" --threads 2 $Q $ALLOW_DOUBLE --failures-only --timeout 65
step device_check_threads_4 80 "$CHECK" --threads 4 $Q $ALLOW_DOUBLE --failures-only --timeout 75
step device_check_procs_2 50 "$CHECK" --procs 2 $Q $ALLOW_DOUBLE --failures-only --timeout 45

# The moved host code and the waits, each bounded: the proxy's connections,
# a peer killed mid-kernel, group launches (several ops per plan).
step device_check_socket_procs_2 45 env PLAIT_TRANSPORT=socket "$CHECK" --procs 2 --quick $ALLOW_DOUBLE \
    --failures-only --timeout 40
step dead_peer_ipc 30 "$DP" $ALLOW_DOUBLE
step dead_peer_socket 30 "$DP" --socket $ALLOW_DOUBLE
EG=64M
[ -n "$ALLOW_DOUBLE" ] && EG=1M
step all_reduce_perf_grouped_2 40 "$AR" --threads 2 -D 1 -b 16 -e $EG -f 16 -w 1 -n 2 -m 8 -c 1 -T 30

# Timings on device buffers (-D 1), ranks as threads; nccl-tests' table in each log.
P="-D 1 -f 4 -w 1 -n 5 -c 0 -T 60"
E12=1G
E4=256M
E64=64M
if [ "$QUICK" = 1 ]; then E12=256M; E4=64M; fi
if [ -n "$ALLOW_DOUBLE" ]; then E12=16M; E4=4M; E64=4M; fi
for coll in all_reduce all_gather reduce_scatter; do
    case $coll in all_reduce) exe=$AR ;; all_gather) exe=$AG ;; reduce_scatter) exe=$RS ;; esac
    step "${coll}_perf_threads_1" 40 "$exe" --threads 1 -b 16 -e $E12 $P
    step "${coll}_perf_threads_2" 40 "$exe" --threads 2 -b 16 -e $E12 $P
    step "${coll}_perf_threads_4" 40 "$exe" --threads 4 -b 16 -e $E4 $P
done
# The same tools checked (-c 1): every size's result is compared.
for coll in all_reduce all_gather reduce_scatter; do
    case $coll in all_reduce) exe=$AR ;; all_gather) exe=$AG ;; reduce_scatter) exe=$RS ;; esac
    step "${coll}_perf_checked_2" 40 "$exe" --threads 2 -D 1 -b 16 -e $E64 -f 16 -w 1 -n 2 -c 1 -T 30
done

if [ -n "$ALLOW_DOUBLE" ]; then
    step gpu_reduce_bw 40 "$RBW" --allow-double --bytes 16M --iters 2
else
    step gpu_reduce_bw 40 "$RBW"
fi

[ "$DRY" = 1 ] && exit 0
# The figures: busbw at the largest size of each timing run, and the kernel's bandwidth.
say ""
say "# at the largest size, GB/s: algbw / busbw out-of-place, algbw / busbw in-place:"
for f in "$LOGDIR"/*_perf_threads_*.log; do
    [ -f "$f" ] || continue
    line=$(grep -E '^ +[0-9]+ +[0-9]+ ' "$f" | tail -1)
    [ -n "$line" ] && say "$(printf '  %-30s %s' "$(basename "$f" .log)" "$(echo "$line" | awk '{ printf "%s B: %s / %s, %s / %s", $1, $7, $8, $11, $12 }')")"
done
if [ -f "$LOGDIR/gpu_reduce_bw.log" ]; then
    say "# local reduction kernel:"
    grep -E '^  (fp32|bf16|fp16)|^# gpu_reduce_bw' "$LOGDIR/gpu_reduce_bw.log" | sed 's/^/  /' | tee -a "$SUMMARY"
fi
TOTAL=$(( $(date +%s) - START ))
say ""
if [ "$FAILED" -gt 0 ]; then
    say "gpu_check: FAIL: $FAILED step(s) failed, $RAN passed, $SKIPPED skipped, ${TOTAL}s"
    exit 1
fi
if [ "$RAN" -eq 0 ]; then
    say "gpu_check: SKIP: no step ran on a GPU, ${TOTAL}s"
    exit 77
fi
say "gpu_check: PASS: $RAN step(s) passed, $SKIPPED skipped, ${TOTAL}s"
exit 0
