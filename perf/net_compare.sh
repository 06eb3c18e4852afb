#!/usr/bin/env bash
# The Socket net provider's bandwidth side by side with iperf3, alternating,
# on loopback (or PLAIT_SOCKET_IFNAME's interface with IPERF_HOST): medians
# of ROUNDS rounds, GB/s (1e9 bytes/s) one way.
#
#   perf/net_compare.sh [BUILD_DIR] [ROUNDS] [CONFIGS]
#
# CONFIGS: threads x sockets-per-thread settings, "T:S ..." (default
# "0:0 1:1 1:2 2:1 2:2"). iperf3 is skipped when not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-5}
configs=${3:-"0:0 1:1 1:2 2:1 2:2"}
host=${IPERF_HOST:-127.0.0.1}
sizes="65536 1048576 4194304 67108864"
out=$(mktemp)
trap 'rm -f "$out"; [ -n "${srv:-}" ] && kill "$srv" 2>/dev/null || true' EXIT

have_iperf=0
if command -v iperf3 >/dev/null; then
    have_iperf=1
    port=$((20000 + $$ % 20000))
    iperf3 -s -p "$port" >/dev/null 2>&1 &
    srv=$!
    sleep 0.5
fi

for r in $(seq "$rounds"); do
    if [ $have_iperf = 1 ]; then
        for p in 1 2; do
            g=$(iperf3 -c "$host" -p "$port" -t 2 -P "$p" -f g -J 2>/dev/null |
                python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9)')
            echo "iperf3_P$p all $g" >>"$out"
        done
    fi
    for c in $configs; do
        t=${c%:*}
        s=${c#*:}
        "$build"/perf/net_perf -b 65536 -e 67108864 -f 4 -t 0.3 -T "$t" -S "$s" |
            awk -v c="socket_T${t}_S${s}" -v sz="$sizes" 'BEGIN{n=split(sz,a," "); for(i=1;i<=n;i++) keep[a[i]]=1}
                !/^#/ && ($1 in keep) {print c, $1, $3}' >>"$out"
    done
done

python3 - "$out" "$rounds" <<'EOF'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, size, v = line.split()
    rows[(name, size)].append(float(v))
names = sorted({k[0] for k in rows}, key=lambda n: (not n.startswith("iperf3"), n))
sizes = sorted({k[1] for k in rows if k[1] != "all"}, key=int)
print(f"# medians of {sys.argv[2]} alternating rounds, GB/s one way")
print("%-16s" % "" + "".join("%12s" % s for s in sizes) + "%12s" % "stream")
for n in names:
    if n.startswith("iperf3"):
        print("%-16s" % n + "".join("%12s" % "" for _ in sizes) + "%12.3f" % statistics.median(rows[(n, "all")]))
    else:
        print("%-16s" % n + "".join("%12.3f" % statistics.median(rows[(n, s)]) for s in sizes))
EOF
