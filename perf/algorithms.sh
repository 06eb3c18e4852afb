#!/usr/bin/env bash
# Per-algorithm benchmark and correctness sweep: for every algorithm of the table
# (plait-verify --list) and every collective it implements, runs the matching
# nccl-tests-style program with PLAIT_ALGO=<coll>:<algo> on --np local ranks.
#
#   perf/algorithms.sh                 busbw (out of place / in place, GB/s) at 4K, 1M, 64M, 4 ranks
#   perf/algorithms.sh --check         every size 8 B .. 64 MiB (x4 steps): prints #wrong, fails unless 0
#   NP=3 SIZES="8 4K" perf/algorithms.sh   other rank count / sizes; ALGOS="ring tree" to choose
#
# Output: one line per (algorithm, collective): the busbw at each size, or the
# largest #wrong seen. Exit status 1 when a run failed or any #wrong was not 0.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
NP=${NP:-4}
SIZES=${SIZES:-"4K 1M 64M"}
check=0
[ "${1:-}" = "--check" ] && check=1

declare -A tool=([allreduce]=all_reduce_perf [broadcast]=broadcast_perf [reduce]=reduce_perf
    [allgather]=all_gather_perf [reducescatter]=reduce_scatter_perf [alltoall]=alltoall_perf
    [gather]=gather_perf [scatter]=scatter_perf)

status=0
while read -r algo colls; do
    [ "$algo" = "name" ] && continue
    if [ -n "${ALGOS:-}" ] && ! [[ " $ALGOS " == *" $algo "* ]]; then continue; fi
    for coll in $colls; do
        t=${tool[$coll]:-}
        [ -z "$t" ] && continue
        if [ $check = 1 ]; then
            out=$(PLAIT_ALGO="$coll:$algo" timeout 600 "$B/perf/$t" --np "$NP" -b 8 -e 64M -f 4 -n 3 -w 1 2>&1)
            rc=$?
            # the #wrong columns: 9 (out of place) and 13 (in place)
            worst=$(printf '%s\n' "$out" | awk '!/^#/ && NF >= 13 { for (c = 9; c <= 13; c += 4) if ($c != "N/A" && $c + 0 > w) w = $c + 0 } END { print w + 0 }')
            rows=$(printf '%s\n' "$out" | awk '!/^#/ && NF >= 13' | wc -l)
            printf '%-14s %-14s sizes %2d  #wrong %s%s\n' "$algo" "$coll" "$rows" "$worst" \
                "$([ $rc = 0 ] || echo "  (exit $rc: $(printf '%s\n' "$out" | grep -v '^#' | tail -1))")"
            if [ $rc != 0 ] || [ "$worst" != 0 ] || [ "$rows" = 0 ]; then status=1; fi
        else
            line=$(printf '%-14s %-14s' "$algo" "$coll")
            for s in $SIZES; do
                out=$(PLAIT_ALGO="$coll:$algo" timeout 600 "$B/perf/$t" --np "$NP" -b "$s" -e "$s" -n 20 -w 3 2>&1)
                rc=$?
                bw=$(printf '%s\n' "$out" | awk '!/^#/ && NF >= 13 { print $8 "/" $12 }' | tail -1)
                [ $rc = 0 ] && [ -n "$bw" ] || { bw="fail"; status=1; }
                line+=$(printf '  %5s %-13s' "$s" "$bw")
            done
            echo "$line"
        fi
    done
done < <("$B/tools/plait-verify" --list)
exit $status
