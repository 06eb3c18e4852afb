#!/usr/bin/env bash
# NCCL's environment through plait's libnccl.so.2 (issue 4, part 5): the user's
# program (nccl_app, linked against NVIDIA's library) under LD_PRELOAD of ours.
#
#   tests/nccl/nccl_env.sh NCCL_APP OUR_LIBNCCL
#
# 1. A job configured for NCCL keeps running: NCCL_ALGO and NCCL_PROTO naming
#    what plait lacks (NVLS, LL128), an unreadable NCCL_TOPO_FILE, NCCL_IB_HCA,
#    NCCL_NET=IB each give a WARN and are ignored; NCCL_TOPO_DUMP_FILE is written; NCCL_SHM_DISABLE,
#    NCCL_BUFFSIZE (in hexadecimal, as NCCL reads it), NCCL_MIN_CTAS/NCCL_MAX_CTAS, NCCL_P2P_DISABLE and
#    NCCL_SOCKET_IFNAME are accepted; the log goes to NCCL_DEBUG_FILE with %p
#    expanded. Every check of nccl_app must still pass.
# 2. PLAIT_* wins over NCCL_*: PLAIT_ALGO=ring with NCCL_ALGO=NVLS passes
#    without the NCCL_ALGO warning.
# 3. PLAIT_* stays strict: PLAIT_ALGO=NVLS fails at init (nccl_app exits 3).
set -uo pipefail
app=${1:?usage: nccl_env.sh NCCL_APP OUR_LIBNCCL}
lib=${2:?usage: nccl_env.sh NCCL_APP OUR_LIBNCCL}
failed=0
fail() {
    echo "FAIL: $*"
    failed=1
}

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# Runs nccl_app with LD_PRELOAD and the given variables (NAME=VALUE ...); the
# program's output goes to $dir/out.$tag; prints nothing; returns its status.
run_app() {
    local tag=$1 nranks=$2
    shift 2
    env -u PLAIT_ALGO -u NCCL_ALGO -u PLAIT_DEBUG LD_PRELOAD="$lib" "$@" \
        timeout 50 "$app" "$nranks" --expect-lib "$lib" >"$dir/out.$tag" 2>&1
}

# --- 1. a job configured for NCCL ----------------------------------------------
mkdir -p "$dir/log1"
run_app nccl 3 NCCL_DEBUG=WARN NCCL_DEBUG_FILE="$dir/log1/nccl.%p.log" \
    NCCL_ALGO=NVLS,Ring NCCL_PROTO=LL128 NCCL_TOPO_FILE=/nonexistent/topo.xml \
    NCCL_TOPO_DUMP_FILE="$dir/topo-dump.xml" NCCL_IB_HCA=mlx5_0 NCCL_NET=IB \
    NCCL_SHM_DISABLE=1 NCCL_BUFFSIZE=0x100000 NCCL_MIN_CTAS=1 NCCL_MAX_CTAS=2 \
    NCCL_P2P_DISABLE=1 NCCL_SOCKET_IFNAME=lo
rc=$?
if [ "$rc" -eq 0 ]; then
    echo "ok: nccl_app passes with NCCL_* variables written for NCCL ($(grep -c '\] ok:' "$dir/out.nccl") checks)"
else
    fail "nccl_app with NCCL_* variables exited with $rc:"
    grep -v '\] ok:' "$dir/out.nccl" | head -20
fi
logs=("$dir"/log1/nccl.*.log)
if [ -e "${logs[0]}" ]; then
    echo "ok: NCCL_DEBUG_FILE honoured (${#logs[@]} files, e.g. $(basename "${logs[0]}"))"
    if ls "$dir/log1" | grep -q '%p'; then
        fail "NCCL_DEBUG_FILE: %p was not expanded ($(ls "$dir/log1" | head -1))"
    fi
else
    fail "NCCL_DEBUG_FILE=$dir/log1/nccl.%p.log: no log file was written"
fi
for var in NCCL_ALGO NCCL_PROTO NCCL_TOPO_FILE NCCL_IB_HCA NCCL_NET; do
    line=$(cat "$dir"/log1/*.log 2>/dev/null | grep -m1 "WARN.*$var")
    if [ -n "$line" ]; then
        echo "ok: $var gives a WARN: ${line#* WARN }"
    else
        fail "no WARN for $var in the NCCL_DEBUG_FILE logs"
    fi
done
# NCCL_TOPO_DUMP_FILE is honoured: rank 0 writes the (discovered) topology.
if grep -q '<plait_topology' "$dir/topo-dump.xml" 2>/dev/null; then
    echo "ok: NCCL_TOPO_DUMP_FILE: the topology was written ($(grep -c '<cpu' "$dir/topo-dump.xml") cpu node(s))"
else
    fail "NCCL_TOPO_DUMP_FILE=$dir/topo-dump.xml: no topology was written"
fi

# --- 2. PLAIT_* wins -----------------------------------------------------------
mkdir -p "$dir/log2"
run_app plait_wins 2 PLAIT_ALGO=ring NCCL_ALGO=NVLS NCCL_DEBUG=WARN NCCL_DEBUG_FILE="$dir/log2/nccl.%p.log"
rc=$?
if [ "$rc" -ne 0 ]; then
    fail "PLAIT_ALGO=ring with NCCL_ALGO=NVLS: nccl_app exited with $rc"
    grep -v '\] ok:' "$dir/out.plait_wins" | head -20
elif cat "$dir"/log2/*.log 2>/dev/null | grep -q 'WARN.*NCCL_ALGO'; then
    fail "PLAIT_ALGO=ring with NCCL_ALGO=NVLS: NCCL_ALGO was still read (it WARNed)"
else
    echo "ok: PLAIT_ALGO=ring wins over NCCL_ALGO=NVLS (passes, no NCCL_ALGO warning)"
fi

# --- 3. PLAIT_* is strict ----------------------------------------------------------
run_app plait_strict 2 PLAIT_ALGO=NVLS
rc=$?
if [ "$rc" -eq 3 ]; then
    echo "ok: PLAIT_ALGO=NVLS fails at init: $(grep -m1 'FAIL: nccl' "$dir/out.plait_strict" | sed 's/^\[[a-z0-9 ]*\] FAIL: //')"
else
    fail "PLAIT_ALGO=NVLS: nccl_app exited with $rc, expected 3 (init refused)"
fi

exit "$failed"
