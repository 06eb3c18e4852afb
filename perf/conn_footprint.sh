#!/usr/bin/env bash
# perf/conn_footprint.sh — what a communicator costs per rank: shared memory, file
# descriptors, init time, and the first call (which may connect) against the second.
#
#   perf/conn_footprint.sh [--sizes 8,32,64] [--patterns allreduce,p2p]
#                          [--variants default,PLAIT_ALGO=ring] [--netns]
#                          [--timeout S] [--out DIR]
#
# For every size N, pattern and variant it starts N ranks as processes of this
# host (build/perf/conn_footprint, from BUILD_DIR, default build/; built with
# ninja when its build folder exists), each from PLAIT_RANK/PLAIT_NRANKS/
# PLAIT_COMM_ID (plait_comm_init_from_env). --netns puts ranks 0 .. ceil(N/2)-1
# in one network namespace and the rest in another, joined by a veth pair (as
# root; each namespace is then a host, with TCP between them).
#
# Patterns: allreduce (float sum of 8 B twice, then of 1 MiB twice) and p2p (each
# rank sends to rank + 1 and receives from rank - 1 in one group, the same sizes).
# A variant is "default" or VAR=VALUE[+VAR=VALUE...] set in every rank's
# environment. Shared memory is counted from each rank's /proc/self/smaps
# (plait unlinks its /dev/shm/plait-* segments after init: they show as
# "(deleted)" mappings): "mapped" is the mappings' size, "in all" counts each
# segment once however many ranks map it, "resident" sums the ranks' Pss, and
# "used (df)" is what /dev/shm's file system holds at that point beyond what it
# held before the job (other users of /dev/shm at the same time blur it).
# Init is timed from after a file barrier that every rank has reached, so the
# launch is not in it; the first call likewise. File descriptors: the rank's
# own beyond 0-2; "other" are mostly pidfds of local peers and pipes (the kinds
# are listed per rank as "seginitfd"/"segendfd" lines in <out>/*/out.<rank>).
#
# Prints one Markdown table (also written to <out>/table.md). Every job has a
# deadline (--timeout, default 120 s + 10 s per rank); every process started is
# killed on exit; the script fails if a rank or one of its /dev/shm/plait-<pid>-*
# segments is left over.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
sizes=8,32,64 patterns=allreduce,p2p variants="default,PLAIT_ALGO=ring" use_netns=0 job_timeout="" out=""
build_dir=${BUILD_DIR:-build}
[[ $build_dir = /* ]] || build_dir="$here/$build_dir"

die() { echo "conn_footprint.sh: error: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }
usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; }

while (($#)); do
    case $1 in
    --sizes) sizes=${2:?}; shift 2 ;;
    --patterns) patterns=${2:?}; shift 2 ;;
    --variants) variants=${2:?}; shift 2 ;;
    --netns) use_netns=1; shift ;;
    --timeout) job_timeout=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
    esac
done
IFS=, read -r -a size_list <<< "$sizes"
IFS=, read -r -a pattern_list <<< "$patterns"
IFS=, read -r -a variant_list <<< "$variants"
for n in "${size_list[@]}"; do [[ $n =~ ^[1-9][0-9]*$ ]] || die "--sizes wants positive integers"; done
for p in "${pattern_list[@]}"; do [[ $p = allreduce || $p = p2p ]] || die "unknown pattern '$p'"; done
for v in "${variant_list[@]}"; do
    [[ $v = default || $v =~ ^[A-Z_][A-Z0-9_]*=[^+]*(\+[A-Z_][A-Z0-9_]*=[^+]*)*$ ]] || die "variant '$v' is not default or VAR=VALUE[+VAR=VALUE]"
done
[[ -z $job_timeout || $job_timeout =~ ^[1-9][0-9]*$ ]] || die "--timeout wants seconds"

if [[ -f $build_dir/build.ninja ]]; then
    ninja -C "$build_dir" -j2 perf/conn_footprint > /dev/null || die "ninja -C $build_dir failed"
fi
exe=$build_dir/perf/conn_footprint
[[ -x $exe ]] || die "$exe was not built (scripts/build.sh release)"

[[ -n $out ]] || out=$(mktemp -d /tmp/plait-footprint.XXXXXX)
mkdir -p "$out"

pids=()
ns=("plaitfp$$a" "plaitfp$$b")
addr=(10.198.0.1 10.198.0.2)
veth=("fp$$a" "fp$$b")
all_pids=()
ns_created=0

kill_ranks() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2> /dev/null || true; done
    sleep 0.5
    # Each rank runs under `timeout`, which leads a process group of its own.
    for p in "${pids[@]}"; do kill -KILL -- "-$p" 2> /dev/null || kill -KILL "$p" 2> /dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2> /dev/null || true; done
    pids=()
}
cleanup() {
    kill_ranks
    if ((ns_created)); then
        local n
        for n in "${ns[@]}"; do
            ip netns pids "$n" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
            ip netns del "$n" 2> /dev/null || true
        done
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ((use_netns)); then
    ((EUID == 0)) || die "--netns creates network namespaces: run as root"
    command -v ip > /dev/null || die "--netns needs ip (iproute2; scripts/deps.sh installs it)"
    ns_created=1
    ip netns add "${ns[0]}" && ip netns add "${ns[1]}" || die "ip netns add failed"
    ip link add "${veth[0]}" type veth peer name "${veth[1]}" || die "ip link add type veth failed"
    for i in 0 1; do
        ip link set "${veth[i]}" netns "${ns[i]}"
        ip -n "${ns[i]}" addr add "${addr[i]}/24" dev "${veth[i]}"
        ip -n "${ns[i]}" link set "${veth[i]}" up
        ip -n "${ns[i]}" link set lo up
    done
fi

# Bytes in use on /dev/shm's file system: unlinked segments still held open
# count, so this is the memory plait's segments really occupy (tmpfs allocates
# a page when it is first written).
shm_used() { df -B1 --output=used /dev/shm 2> /dev/null | tail -n 1 | tr -d ' '; }

# Waits until $1 files named $2.* exist in $3, or a rank has exited, or $4 s pass.
wait_files() {
    local want=$1 name=$2 d=$3 limit=$4 start=$SECONDS p
    while :; do
        local have
        have=$(find "$d" -maxdepth 1 -name "$name.*" | wc -l)
        ((have >= want)) && return 0
        ((SECONDS - start < limit)) || { echo "timed out after ${limit}s ($have of $want ranks reached $name)"; return 1; }
        for p in "${pids[@]}"; do
            kill -0 "$p" 2> /dev/null || { echo "a rank exited before $name ($have of $want reached it)"; return 1; }
        done
        sleep 0.1
    done
}

# One job: N ranks, pattern, variant, into folder $4. Returns non-zero on failure.
run_job() {
    local n=$1 pattern=$2 variant=$3 d=$4 limit=${job_timeout:-$((120 + 10 * $1))}
    # The root's port: below Linux's ephemeral range (32768..), where the
    # previous job's many closed connections linger in TIME_WAIT.
    local port=$((20000 + RANDOM % 12000)) secret r root=127.0.0.1 per_ns=$(((n + 1) / 2)) rc=0 why=""
    local envs=()
    [[ $variant = default ]] || IFS=+ read -r -a envs <<< "$variant"
    secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    ((use_netns)) && root=${addr[0]}
    mkdir -p "$d"
    for ((r = 0; r < n; r++)); do
        local wrap=()
        ((use_netns)) && wrap=(ip netns exec "${ns[r / per_ns]}")
        env "${envs[@]}" PLAIT_RANK=$r PLAIT_NRANKS=$n PLAIT_COMM_ID="$root:$port" PLAIT_SECRET="$secret" \
            timeout -k 5 "$limit" "${wrap[@]}" "$exe" --pattern "$pattern" --dir "$d" --timeout "$limit" \
            > "$d/out.$r" 2> "$d/err.$r" &
        pids+=($!)
        all_pids+=($!)
    done
    shm_used > "$d/tmpfs.base"
    why=$(wait_files "$n" ready0 "$d" "$limit") || rc=1
    if ((rc == 0)); then
        touch "$d/go0"
        why=$(wait_files "$n" ready1 "$d" "$limit") || rc=1
    fi
    shm_used > "$d/tmpfs.init"
    ((rc == 0)) && touch "$d/go1"
    if ((rc == 0)); then
        why=$(wait_files "$n" ready2 "$d" "$limit") || rc=1
    fi
    shm_used > "$d/tmpfs.end"
    ((rc == 0)) && touch "$d/go2"
    if ((rc == 0)); then
        for r in "${!pids[@]}"; do
            local st=0
            wait "${pids[r]}" || st=$?
            if ((st != 0)); then
                rc=1
                why="rank $r exited with status $st$( ((st == 124)) && echo " (timed out after ${limit}s)")"
            fi
        done
    fi
    kill_ranks
    if ((rc != 0)); then
        echo "conn_footprint.sh: N=$n $pattern $variant failed: $why; first errors:" >&2
        cat "$d"/err.* 2> /dev/null | grep -v '^$' | head -n 5 >&2 || true
    fi
    return $rc
}

# Medians and maxima over the ranks of one job: one table row.
summarize() {
    local n=$1 pattern=$2 variant=$3 d=$4
    local base used_i used_e
    base=$(cat "$d/tmpfs.base") used_i=$(cat "$d/tmpfs.init") used_e=$(cat "$d/tmpfs.end")
    cat "$d"/out.* | awk -v n="$n" -v pattern="$pattern" -v variant="$variant" -v hosts=$((use_netns ? 2 : 1)) \
        -v tmpfs_i=$((used_i - base)) -v tmpfs_e=$((used_e - base)) '
    function kv(line, key,   i, f, m) { m = split(line, f, " "); for (i = 1; i <= m; i++) if (index(f[i], key "=") == 1) return substr(f[i], length(key) + 2) + 0; return 0 }
    function med(arr, cnt,   i, j, t) {
        for (i = 2; i <= cnt; i++) { t = arr[i]; for (j = i - 1; j >= 1 && arr[j] > t; j--) arr[j + 1] = arr[j]; arr[j + 1] = t }
        return cnt % 2 ? arr[(cnt + 1) / 2] : (arr[cnt / 2] + arr[cnt / 2 + 1]) / 2
    }
    function mx(arr, cnt,   i, m) { m = arr[1]; for (i = 2; i <= cnt; i++) if (arr[i] > m) m = arr[i]; return m }
    function mib(b) { return b >= 10 * 1048576 ? sprintf("%.0f", b / 1048576) : sprintf("%.2f", b / 1048576) }
    function us(v) { return v >= 10000 ? sprintf("%.0f ms", v / 1000) : v >= 1000 ? sprintf("%.1f ms", v / 1000) : v >= 10 ? sprintf("%.0f us", v) : sprintf("%.1f us", v) }
    function both(a, b) { return a == b ? a : a " → " b }
    $1 == "seginit" { k = $2 " " $3 " " $4; if (!(k in ui)) { ui[k] = 1; tot_i += $5 } next }
    $1 == "segend" { k = $2 " " $3 " " $4; if (!(k in ue)) { ue[k] = 1; tot_e += $5 } next }
    /^phase=init/ { ni++; init[ni] = kv($0, "init_us"); vi[ni] = kv($0, "shm_vsz"); pssi += kv($0, "shm_pss"); si[ni] = kv($0, "sockets"); oi[ni] = kv($0, "other_fds") }
    /^phase=end/ { ne++; ve[ne] = kv($0, "shm_vsz"); psse += kv($0, "shm_pss"); se[ne] = kv($0, "sockets"); oe[ne] = kv($0, "other_fds") }
    /^phase=calls/ { nc++; f8[nc] = kv($0, "first8_us"); s8[nc] = kv($0, "second8_us"); f1[nc] = kv($0, "first1m_us"); s1[nc] = kv($0, "second1m_us") }
    END {
        if (ni != n || ne != n || nc != n) { printf("| %d | %d | %s | %s | incomplete: %d/%d/%d of %d ranks reported |\n", n, hosts, pattern, variant, ni, nc, ne, n); exit }
        printf("| %d | %d | %s | %s | %s / %s | %s | %s | %s | %s | %s + %s | %s / %s | %s / %s | %s / %s | %s / %s |\n",
            n, hosts, pattern, variant,
            us(med(init, n)), us(mx(init, n)),
            both(mib(med(vi, n)), mib(med(ve, n))), both(mib(tot_i), mib(tot_e)), both(mib(pssi), mib(psse)),
            both(mib(tmpfs_i), mib(tmpfs_e)),
            both(med(si, n), med(se, n)), both(med(oi, n), med(oe, n)),
            us(med(f8, n)), us(mx(f8, n)), us(med(s8, n)), us(mx(s8, n)),
            us(med(f1, n)), us(mx(f1, n)), us(med(s1, n)), us(mx(s1, n)))
    }'
}

table=$out/table.md
{
    echo "| ranks | hosts | pattern | env | init median / max | shm MiB mapped per rank (median) | shm MiB in all (each segment once) | shm MiB resident in all (sum of Pss) | /dev/shm MiB used (df) | fds per rank: sockets + other (median) | first 8 B call median / max | second 8 B | first 1 MiB | second 1 MiB |"
    echo "|---:|---:|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
} > "$table"
failed=0
for n in "${size_list[@]}"; do
    for variant in "${variant_list[@]}"; do
        for pattern in "${pattern_list[@]}"; do
            d=$out/n$n.$pattern.${variant//[^A-Za-z0-9_=]/_}
            note "$n ranks, $pattern, $variant ($d)"
            start=$SECONDS
            ok=0
            run_job "$n" "$pattern" "$variant" "$d" && ok=1
            if ((!ok)) && grep -qs "Address already in use" "$d"/err.*; then
                note "  the root's port was taken: once more on another"
                rm -rf "$d"
                run_job "$n" "$pattern" "$variant" "$d" && ok=1
            fi
            if ((ok)); then
                summarize "$n" "$pattern" "$variant" "$d" >> "$table"
            else
                failed=1
                echo "| $n | $((use_netns ? 2 : 1)) | $pattern | $variant | failed: see $d/err.* |" >> "$table"
            fi
            note "  $((SECONDS - start)) s"
        done
    done
done

{
    echo "## Connection footprint: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $(git -C "$here" rev-parse --short HEAD 2> /dev/null || echo '?')"
    echo
    cat "$table"
    echo
    echo "X → Y: right after init → after the four calls. Timings are per rank, median / max over the ranks."
    echo "Raw outputs: $out"
} | tee "$out/summary.md"

# Nothing may be left behind.
cleanup
trap - EXIT
# plait names a segment /plait-<pid of its creator>-...: only ours count (other
# programs on this machine may be using plait at the same time).
leftover=0
for pid in $(cat "$out"/*/out.* 2> /dev/null | awk '/^phase=init/ { for (i = 1; i <= NF; i++) if ($i ~ /^pid=/) print substr($i, 5) }' | sort -u); do
    leftover=$((leftover + $(find /dev/shm -maxdepth 1 -name "plait-$pid-*" 2> /dev/null | wc -l)))
done
for p in "${all_pids[@]}"; do
    if kill -0 -- "-$p" 2> /dev/null; then
        echo "conn_footprint.sh: FAILED: a process of rank group $p is still running" >&2
        kill -KILL -- "-$p" 2> /dev/null || true
        failed=1
    fi
done
if ((leftover > 0)); then
    echo "conn_footprint.sh: FAILED: $leftover /dev/shm/plait-<pid>-* segment(s) of our ranks left over" >&2
    failed=1
fi
((failed == 0)) || exit 1
