#!/usr/bin/env bash
# Fuzzes the topology XML loader and dumper, and the hwloc XML rewriter
# (tests/fuzz/fuzz_topo_xml.c) with libFuzzer under ASan and UBSan.
#
#   tests/fuzz/run.sh SECONDS [WORKDIR]
#
# Builds the target with clang straight from the sources it needs, seeds a
# corpus in WORKDIR (default: a new temporary directory) from tests/fuzz/corpus/
# and the topology fixtures, and fuzzes for SECONDS. Nothing is written into
# the source tree: crashing inputs land in WORKDIR (copy them into
# tests/fuzz/corpus/ as regression seeds once fixed).
#
# Exit status: 0 no crash; 1 a crash, leak or failed check (the artifact is
# named); 2 usage or build error; 77 clang or its libFuzzer runtime is missing
# (Debian: apt-get install clang libclang-rt-14-dev). The last line is
#   fuzz: N runs, C crashes in S s
set -u

usage() { echo "usage: $0 SECONDS [WORKDIR]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
SECONDS_TO_RUN=$1
case $SECONDS_TO_RUN in '' | *[!0-9]*) usage ;; esac

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CLANG=${CLANG:-}
if [ -z "$CLANG" ]; then
    for c in clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14; do
        if command -v "$c" >/dev/null 2>&1; then CLANG=$c; break; fi
    done
fi
if [ -z "$CLANG" ]; then
    echo "fuzz: SKIP: clang is not installed (apt-get install clang libclang-rt-14-dev)"
    exit 77
fi

if [ $# -ge 2 ]; then
    WORK=$2
    case $(realpath -m "$WORK")/ in
    "$ROOT"/*) echo "fuzz: WORKDIR must be outside the source tree" >&2; exit 2 ;;
    esac
    mkdir -p "$WORK" || exit 2
else
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/plait-fuzz-topo-xml.XXXXXX") || exit 2
fi
WORK=$(cd "$WORK" && pwd)
case $WORK/ in "$ROOT"/*) echo "fuzz: WORKDIR must be outside the source tree" >&2; exit 2 ;; esac

# The libFuzzer runtime comes in a separate package on Debian: probe for it
# with an empty target so that its absence is a skip, not a build failure.
printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
    >"$WORK/probe.c"
if ! "$CLANG" -fsanitize=fuzzer,address,undefined "$WORK/probe.c" -o "$WORK/probe" >"$WORK/probe.log" 2>&1; then
    echo "fuzz: SKIP: $CLANG cannot link -fsanitize=fuzzer,address,undefined (apt-get install libclang-rt-14-dev):"
    sed 's/^/    /' "$WORK/probe.log" | head -5
    exit 77
fi

FUZZER=$WORK/fuzz_topo_xml
if ! "$CLANG" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -g -O1 -std=gnu11 \
    -I"$ROOT/include" -I"$ROOT" \
    "$ROOT/tests/fuzz/fuzz_topo_xml.c" "$ROOT/topology/xml.c" "$ROOT/topology/nccl_xml.c" \
    "$ROOT/topology/topo.c" "$ROOT/topology/hwloc_xml.c" "$ROOT/base/log.c" "$ROOT/base/file.c" -lm -lpthread -o "$FUZZER" 2>"$WORK/build.log"; then
    cat "$WORK/build.log" >&2
    echo "fuzz: build failed"
    exit 2
fi

# Seeds: copies only, the fuzzer adds to this directory.
CORPUS=$WORK/corpus
mkdir -p "$CORPUS"
for f in "$ROOT"/tests/fuzz/corpus/* "$ROOT"/tests/fixtures/topo/*.xml "$ROOT"/tests/fixtures/nccl/*.xml \
    "$ROOT"/tests/fixtures/comm/*.xml "$ROOT"/tests/fixtures/hwloc/*.xml; do
    [ -f "$f" ] && cp "$f" "$CORPUS/seed-$(basename "$(dirname "$f")")-$(basename "$f")"
done

# A dictionary of the formats' words helps the mutator past the tag and attribute names.
cat >"$WORK/xml.dict" <<'DICT'
"<?xml version=\"1.0\"?>"
"<!--"
"-->"
"<plait_topology version=\"1\">"
"</plait_topology>"
"<system version=\"1\">"
"</system>"
"<cpu"
"</cpu>"
"<pci"
"</pci>"
"<gpu"
"</gpu>"
"<nic"
"</nic>"
"<nvs"
"<net"
"<link"
"<nvlink"
"<c2c"
"/>"
" name=\""
" a=\""
" b=\""
" type=\"NVL\""
" type=\"PCI\""
" type=\"SYS\""
" type=\"C2C\""
" type=\"NET\""
" lanes=\""
" bw=\""
" latency=\""
" busid=\"0000:18:00.0\""
" numa=\""
" gen=\""
" width=\""
" class=\"0x060400\""
" class=\"0x030200\""
" class=\"0x020700\""
" tclass=\"0x068000\""
" tclass=\"0x030200\""
" tclass=\"0x068001\""
" target=\""
" count=\""
" link_speed=\"16.0 GT/s PCIe\""
" link_width=\"16\""
" affinity=\"ffffffff,00000000\""
" numaid=\""
" host_hash=\""
" speed=\""
" dev=\""
" sm=\""
"&amp;"
"&lt;"
"&#x"
"&#"
"1e308"
"-1"
"nan"
DICT

LOG=$WORK/fuzz.log
start=$(date +%s)
(cd "$WORK" && "$FUZZER" -max_total_time="$SECONDS_TO_RUN" -print_final_stats=1 -dict="$WORK/xml.dict" \
    -artifact_prefix="$WORK/" -max_len=65536 -timeout=10 -rss_limit_mb=2048 "$CORPUS") >"$LOG" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$LOG" | tail -1)
[ -n "$runs" ] || runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$LOG" | tail -1)
[ -n "$runs" ] || runs=$(sed -n 's/^#\([0-9]*\).*/\1/p' "$LOG" | tail -1)
[ -n "$runs" ] || runs=0
if [ $rc -ne 0 ]; then
    grep -E "^==[0-9]+==ERROR|SUMMARY|runtime error|abort|!=|does not" "$LOG" | head -20
    artifact=$(grep -o "$WORK/[a-z-]*-[0-9a-f]*" "$LOG" | tail -1)
    echo "fuzz: log $LOG; artifact ${artifact:-none}"
    echo "fuzz: $runs runs, 1 crashes in $elapsed s"
    exit 1
fi
echo "fuzz: corpus $CORPUS, log $LOG"
echo "fuzz: $runs runs, 0 crashes in $elapsed s"
exit 0
