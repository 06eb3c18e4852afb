#!/usr/bin/env bash
# perf/compare.sh — plait side by side with Open MPI and MPICH on this machine.
#
#   perf/compare.sh [--coll allreduce|allgather|reducescatter|broadcast|reduce|alltoall|sendrecv]
#                   [--np N] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [--rounds R]
#                   [--netns] [--plot FILE.png] [--peers openmpi,mpich] [--timeout S] [--out DIR]
#                   [--small-iters N] [--small-warmup N]  (sizes < 64 KiB: default 2000 and 200)
#                   [--from DIR]   (print the table and plot of an earlier run's --out DIR again)
#
# Installs what is missing (Debian packages, via sudo when not root), builds
# plait (BUILD_DIR, default build/) and the MPI program once per MPI, measures
# the memory bandwidth (perf/membw), then runs every library R times,
# alternating which goes first, and prints per size the median busbw (latency
# in us for sizes <= 64 B), the ratios and plait's fraction of the
# memory-traffic bound. docs/performance.md explains the method and the bounds.
# With --netns each round also runs `iperf3 --bidir` across the same veth; its
# per-direction rate (median of rounds) is printed beside the busbw columns as
# the link's limit (plait/iperf3): for 2-rank allreduce busbw is the bytes each
# rank sends (and receives) per second, which is what iperf3 measures.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
coll=allreduce np=2 min=8 max=256M factor=2 iters=20 warmup=5 rounds=5
# Sizes below small_cut run in a pass of their own with many more iterations:
# at 20 iterations an 8-byte call is timed over ~10 us, which first-call
# effects and one scheduler tick swamp.
small_cut=65536 small_iters=2000 small_warmup=200
use_netns=0 plot="" peers="openmpi,mpich" run_timeout=900 out="" from=""
build_dir=${BUILD_DIR:-build}
[[ $build_dir = /* ]] || build_dir="$here/$build_dir"

die() { echo "compare.sh: error: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }
usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }

while (($#)); do
    case $1 in
    --coll) coll=${2:?}; shift 2 ;;
    --np) np=${2:?}; shift 2 ;;
    -b) min=${2:?}; shift 2 ;;
    -e) max=${2:?}; shift 2 ;;
    -f) factor=${2:?}; shift 2 ;;
    -n) iters=${2:?}; shift 2 ;;
    -w) warmup=${2:?}; shift 2 ;;
    --small-iters) small_iters=${2:?}; shift 2 ;;
    --small-warmup) small_warmup=${2:?}; shift 2 ;;
    --rounds) rounds=${2:?}; shift 2 ;;
    --netns) use_netns=1; shift ;;
    --plot) plot=${2:?}; shift 2 ;;
    --peers) peers=${2?}; shift 2 ;;
    --timeout) run_timeout=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --from) from=${2:?}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
    esac
done

case $coll in
allreduce) prog=all_reduce_perf ;;
allgather) prog=all_gather_perf ;;
reducescatter) prog=reduce_scatter_perf ;;
broadcast) prog=broadcast_perf ;;
reduce) prog=reduce_perf ;;
alltoall) prog=alltoall_perf ;;
sendrecv) prog=sendrecv_perf ;;
*) die "unknown collective '$coll'" ;;
esac
[[ $np =~ ^[1-9][0-9]*$ ]] || die "--np wants a positive integer"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "--rounds wants a positive integer"
[[ $factor =~ ^[2-9][0-9]*$ ]] || die "-f wants an integer >= 2"
if ((use_netns)) && ((np < 2)); then die "--netns needs --np 2 or more"; fi
IFS=, read -r -a peer_list <<< "$peers"
for p in "${peer_list[@]}"; do
    [[ $p = openmpi || $p = mpich ]] || die "unknown peer '$p' (openmpi, mpich)"
done

libs=(plait "${peer_list[@]}")
declare -A lib_ok
for l in "${libs[@]}"; do lib_ok[$l]=1; done
failures=()

if [[ -n $from ]]; then
    # Only the table: the rounds of an earlier run, with the options it ran with.
    [[ -f $from/membw.txt ]] || die "$from holds no earlier run (no membw.txt)"
    out=$from
    for l in "${libs[@]}"; do compgen -G "$from/$l.round*.txt" > /dev/null || lib_ok[$l]=0; done
    rounds=$(find "$from" -name 'plait.round*.txt' | wc -l)
    first=$(find "$from" -name '*.round0.txt' | head -n 1)
    [[ -n $first ]] || die "$from holds no round outputs"
    np=$(awk '/^# Ranks:/ { print $3; exit }' "$first")
    iters=$(awk '/warmup iters:/ { for (i = 1; i < NF; i++) if ($i == "iters:" && $(i - 1) != "warmup") print $(i + 1) }' "$first" | head -n 1)
    warmup=$(awk '/warmup iters:/ { for (i = 1; i < NF; i++) if ($i == "warmup") print $(i + 2) }' "$first" | head -n 1)
    [[ -f $from/hosts.openmpi ]] && use_netns=1
else

# ---------------------------------------------------------------- dependencies

sudo_cmd=()
((EUID == 0)) || sudo_cmd=(sudo)
apt_updated=0
apt_install() {
    command -v apt-get > /dev/null || die "missing $*, and this is not a Debian-like system: install them yourself"
    note "installing $*"
    if ((!apt_updated)); then
        timeout 600 "${sudo_cmd[@]}" apt-get update -qq || die "apt-get update failed"
        apt_updated=1
    fi
    timeout 1200 "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
        > /dev/null || die "apt-get install $* failed"
}

missing=()
command -v meson > /dev/null || missing+=(meson)
command -v ninja > /dev/null || missing+=(ninja-build)
command -v cc > /dev/null || missing+=(gcc)
command -v timeout > /dev/null || missing+=(coreutils)
for p in "${peer_list[@]}"; do
    case $p in
    openmpi) [[ -x /usr/bin/mpicc.openmpi && -x /usr/bin/mpirun.openmpi ]] || missing+=(openmpi-bin libopenmpi-dev) ;;
    mpich) [[ -x /usr/bin/mpicc.mpich && -x /usr/bin/mpiexec.mpich ]] || missing+=(mpich libmpich-dev) ;;
    esac
done
if ((use_netns)); then
    command -v ip > /dev/null || missing+=(iproute2)
    command -v iperf3 > /dev/null || missing+=(iperf3)
    command -v python3 > /dev/null || missing+=(python3)
fi
if [[ -n $plot ]] && ! command -v gnuplot > /dev/null; then missing+=(gnuplot-nox); fi
((${#missing[@]} == 0)) || apt_install "${missing[@]}"

# ---------------------------------------------------------------- builds

if [[ -f $build_dir/build.ninja ]]; then
    ninja -C "$build_dir" > /dev/null || die "ninja -C $build_dir failed"
else
    BUILD_DIR=$build_dir "$here/scripts/build.sh" release > /dev/null || die "scripts/build.sh failed"
fi
for exe in "$prog" membw; do
    [[ -x $build_dir/perf/$exe ]] || die "$build_dir/perf/$exe was not built"
done

src=$here/perf/mpi/mpi_coll_perf.c
declare -A mpi_exe
for p in "${peer_list[@]}"; do
    exe=$build_dir/perf/mpi_coll_perf.$p
    if [[ ! -x $exe || $src -nt $exe ]]; then
        "/usr/bin/mpicc.$p" -std=gnu11 -O2 -Wall -o "$exe" "$src" || die "mpicc.$p could not build $src"
    fi
    mpi_exe[$p]=$exe
done

# ---------------------------------------------------------------- run folder, namespaces

if [[ -z $out ]]; then out=$(mktemp -d /tmp/plait-compare.XXXXXX); fi
mkdir -p "$out"
ns_prefix="plaitcmp$$"
ns=("${ns_prefix}a" "${ns_prefix}b")
addr=(10.199.0.1 10.199.0.2)
veth=("vp$$a" "vp$$b")
ns_created=0

cleanup() {
    if ((ns_created)); then
        ip netns pids "${ns[0]}" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
        ip netns pids "${ns[1]}" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
        ip netns del "${ns[0]}" 2> /dev/null || true
        ip netns del "${ns[1]}" 2> /dev/null || true
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ((use_netns)); then
    ((EUID == 0)) || die "--netns creates network namespaces: run as root"
    ns_created=1
    ip netns add "${ns[0]}" && ip netns add "${ns[1]}" || die "ip netns add failed (no CAP_SYS_ADMIN here?)"
    ip link add "${veth[0]}" type veth peer name "${veth[1]}" || die "ip link add type veth failed"
    for i in 0 1; do
        ip link set "${veth[i]}" netns "${ns[i]}"
        ip -n "${ns[i]}" addr add "${addr[i]}/24" dev "${veth[i]}"
        ip -n "${ns[i]}" link set "${veth[i]}" up
        ip -n "${ns[i]}" link set lo up
    done
    # The remote shell of both MPIs' launchers: "host" is an address, the
    # namespace that owns it plays the remote node (with its own host name).
    agent=$out/netns-agent.sh
    cat > "$agent" << EOF
#!/usr/bin/env bash
set -euo pipefail
while [[ \$1 = -* ]]; do shift; done
host=\$1; shift
case \$host in
${addr[0]}) n=${ns[0]} ;;
${addr[1]}) n=${ns[1]} ;;
*) echo "netns-agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$n" unshare --uts sh -c "hostname \$n; \$*"
EOF
    chmod +x "$agent"
    per_ns=$(((np + 1) / 2))
    printf '%s slots=%d\n%s slots=%d\n' "${addr[0]}" "$per_ns" "${addr[1]}" "$per_ns" > "$out/hosts.openmpi"
    printf '%s:%d\n%s:%d\n' "${addr[0]}" "$per_ns" "${addr[1]}" "$per_ns" > "$out/hosts.mpich"
fi

# ---------------------------------------------------------------- memory bandwidth

nproc=$(nproc)
bw_threads=$((np < nproc ? np : nproc))
((bw_threads >= 1)) || bw_threads=1
threads_arg=1
((bw_threads == 1)) || threads_arg="1,$bw_threads"
timeout "$run_timeout" "$build_dir/perf/membw" -n 5 -t "$threads_arg" > "$out/membw.txt" || die "perf/membw failed"

# ---------------------------------------------------------------- one run per library

# "8", "64K", "256M", "1G" -> bytes.
to_bytes() {
    local v=$1 m=1
    case $v in
    *[kK]) m=1024; v=${v%?} ;;
    *[mM]) m=$((1024 * 1024)); v=${v%?} ;;
    *[gG]) m=$((1024 * 1024 * 1024)); v=${v%?} ;;
    esac
    [[ $v =~ ^[0-9]+$ ]] || die "size '$1' is not a number (with K, M or G)"
    echo $((v * m))
}
min_b=$(to_bytes "$min") max_b=$(to_bytes "$max")
# The passes: "MIN MAX ITERS WARMUP" each; sizes step by the factor from MIN, so
# the second pass starts at the first size of that sequence >= small_cut.
passes=()
if ((min_b >= small_cut)); then
    passes+=("$min_b $max_b $iters $warmup")
else
    s_=$min_b
    while ((s_ * factor < small_cut && s_ * factor <= max_b)); do s_=$((s_ * factor)); done
    passes+=("$min_b $s_ $small_iters $small_warmup")
    if ((s_ * factor <= max_b)); then passes+=("$((s_ * factor)) $max_b $iters $warmup"); fi
fi
perf_args=()

# Runs library $1 over every pass into $2 (the tables one after the other).
run_lib() {
    local l=$1 o=$2 p rc=0 a b n w
    : > "$o"
    : > "$o.err"
    for p in "${passes[@]}"; do
        read -r a b n w <<< "$p"
        perf_args=(-b "$a" -e "$b" -f "$factor" -n "$n" -w "$w" -c 1)
        # plait is timed like the MPIs' blocking calls: on the NULL stream
        # (-y 1), each call complete when it returns, not queued on a stream
        # worker (nccl-tests' CUDA-stream habit, which adds a thread hand-off).
        [[ $l == plait ]] && perf_args+=(-y 1)
        "run_$l" "$o.pass" || rc=$?
        cat "$o.pass" >> "$o"
        cat "$o.pass.err" >> "$o.err" 2> /dev/null || true
        rm -f "$o.pass" "$o.pass.err"
        ((rc == 0)) || return "$rc"
    done
}

run_plait() { # $1: output file
    local o=$1
    if ((!use_netns)); then
        timeout "$run_timeout" "$build_dir/perf/$prog" --np "$np" "${perf_args[@]}" > "$o" 2> "$o.err"
        return
    fi
    # Each rank is a process of its own in its namespace; rank 0 starts the
    # bootstrap root at PLAIT_COMM_ID. Ranks 0 .. per_ns-1 share namespace a.
    local port=$((20000 + RANDOM % 20000)) secret pids=() r rc=0
    secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    for ((r = 0; r < np; r++)); do
        local i=$((r / per_ns))
        PLAIT_RANK=$r PLAIT_NRANKS=$np PLAIT_COMM_ID="${addr[0]}:$port" PLAIT_SECRET=$secret \
            timeout "$run_timeout" ip netns exec "${ns[i]}" "$build_dir/perf/$prog" "${perf_args[@]}" \
            > "$o.rank$r" 2> "$o.err.rank$r" &
        pids+=($!)
    done
    for r in "${!pids[@]}"; do wait "${pids[r]}" || rc=1; done
    cp "$o.rank0" "$o"
    cat "$o".err.rank* > "$o.err"
    return $rc
}

run_openmpi() {
    local o=$1
    # pml ob1: the btl list below is then what carries the data (the UCX pml,
    # when present, would choose its own transports and ignore it).
    local common=(--allow-run-as-root --oversubscribe -np "$np" --bind-to none --mca pml ob1)
    if ((!use_netns)); then
        timeout "$run_timeout" /usr/bin/mpirun.openmpi "${common[@]}" --mca btl self,vader \
            "${mpi_exe[openmpi]}" -C "$coll" "${perf_args[@]}" > "$o" 2> "$o.err"
        return
    fi
    timeout "$run_timeout" ip netns exec "${ns[0]}" /usr/bin/mpirun.openmpi "${common[@]}" \
        --hostfile "$out/hosts.openmpi" --mca plm_rsh_agent "$agent" \
        --mca btl self,vader,tcp --mca btl_tcp_if_include 10.199.0.0/24 --mca oob_tcp_if_include 10.199.0.0/24 \
        "${mpi_exe[openmpi]}" -C "$coll" "${perf_args[@]}" > "$o" 2> "$o.err"
}

run_mpich() {
    local o=$1
    if ((!use_netns)); then
        timeout "$run_timeout" /usr/bin/mpiexec.mpich -n "$np" \
            "${mpi_exe[mpich]}" -C "$coll" "${perf_args[@]}" > "$o" 2> "$o.err"
        return
    fi
    # Debian's MPICH is ch4:ucx, and UCX finds the other namespace on the same
    # machine (same boot id, same /dev/shm) and would use shared memory: TCP
    # only, also between two ranks of one namespace.
    timeout "$run_timeout" ip netns exec "${ns[0]}" /usr/bin/mpiexec.mpich -n "$np" -f "$out/hosts.mpich" \
        -launcher rsh -launcher-exec "$agent" -iface "${veth[0]}" -genv UCX_TLS tcp,self \
        "${mpi_exe[mpich]}" -C "$coll" "${perf_args[@]}" > "$o" 2> "$o.err"
}

# iperf3 --bidir across the veth: the server in the second namespace, the
# client in the first, both directions at once for 5 s after 1 s of warm-up.
# Writes "<GB/s one way> <GB/s other way>" (received bytes, 1e9 B/s) to $1.
run_iperf3() {
    local o=$1 port=$((20000 + RANDOM % 20000)) spid rc=0 t
    timeout 60 ip netns exec "${ns[1]}" iperf3 -s -1 -B "${addr[1]}" -p "$port" > "$o.server" 2>&1 &
    spid=$!
    # The server needs a moment to listen; the client retries its connect.
    for t in 1 2 3 4 5 6 7 8 9 10; do
        sleep 0.3
        if timeout 60 ip netns exec "${ns[0]}" iperf3 -c "${addr[1]}" -p "$port" --bidir -t 5 -O 1 -J \
            > "$o.json" 2> "$o.err"; then
            rc=0
            break
        fi
        rc=1
        grep -q "Connection refused" "$o.json" "$o.err" 2> /dev/null || break
    done
    kill "$spid" 2> /dev/null || true
    wait "$spid" 2> /dev/null || true
    ((rc == 0)) || return 1
    python3 - "$o.json" > "$o" << 'PYEOF' || return 1
import json, sys
e = json.load(open(sys.argv[1]))["end"]
print("%.3f %.3f" % (e["sum_received"]["bits_per_second"] / 8e9,
                     e["sum_received_bidir_reverse"]["bits_per_second"] / 8e9))
PYEOF
}

round_items=("${libs[@]}")
if ((use_netns)); then
    round_items+=(iperf3)
    lib_ok[iperf3]=1
fi
nlibs=${#round_items[@]}
for ((k = 0; k < rounds; k++)); do
    for ((j = 0; j < nlibs; j++)); do
        l=${round_items[(k + j) % nlibs]}
        ((lib_ok[$l])) || continue
        f=$out/$l.round$k.txt
        note "round $((k + 1))/$rounds: $l"
        if [[ $l == iperf3 ]]; then
            if ! run_iperf3 "$f"; then
                lib_ok[iperf3]=0
                failures+=("iperf3: failed; see $f.json and $f.err")
            fi
            continue
        fi
        rc=0
        run_lib "$l" "$f" || rc=$?
        if ((rc != 0)); then
            lib_ok[$l]=0
            why="exit status $rc"
            ((rc == 124)) && why="timed out after ${run_timeout}s"
            failures+=("$l: $why; see $f.err")
            echo "compare.sh: $l failed ($why); its last lines:" >&2
            tail -n 5 "$f.err" >&2 || true
        elif (($(grep -c "Out of bounds values : 0 OK" "$f") != ${#passes[@]})); then
            lib_ok[$l]=0
            failures+=("$l: wrong results (#wrong > 0); see $f")
        fi
    done
done
fi # --from

# iperf3's per-direction rate: the median over rounds of the mean of its two
# directions (both run at once).
iperf_bw=""
if ((use_netns)) && compgen -G "$out/iperf3.round*.txt" > /dev/null; then
    iperf_bw=$(cat "$out"/iperf3.round*.txt | awk '{ print ($1 + $2) / 2 }' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    iperf_all=$(cat "$out"/iperf3.round*.txt | awk '{ printf("%s%.2f/%.2f", NR > 1 ? ", " : "", $1, $2) }')
fi

# The figure of the widest triad measured (min(ranks, CPUs) threads).
bw_threads=$(awk '$1 == "triad" { t = $2 } END { print t }' "$out/membw.txt")

# ---------------------------------------------------------------- the table

triad=$(awk -v t="$bw_threads" '$1 == "triad" && $2 == t { print $3 }' "$out/membw.txt")
triad1=$(awk '$1 == "triad" && $2 == 1 { print $3 }' "$out/membw.txt")
[[ -n $triad ]] || die "no triad figure in $out/membw.txt"

# Rows "lib size time_us busbw" from every successful run. busbw is computed
# again from the time column (size / time x the factor of docs/performance.md):
# the printed busbw has two decimals, which is 0.00 for small sizes.
case $coll in
allreduce) busbw_factor="2*(n-1)/n" ;;
allgather|reducescatter|alltoall) busbw_factor="(n-1)/n" ;;
*) busbw_factor="1" ;;
esac
rows=$out/rows.txt
: > "$rows"
for l in "${libs[@]}"; do
    ((lib_ok[$l])) || continue
    for f in "$out/$l".round*.txt; do
        awk -v l="$l" -v n="$np" -v coll="$coll" '
            BEGIN { f = coll == "allreduce" ? 2 * (n - 1) / n : coll ~ /^(allgather|reducescatter|alltoall)$/ ? (n - 1) / n : 1 }
            $1 !~ /^#/ && NF >= 9 { t = $6 + 0; print l, $1, $6, (t > 0 ? $1 / t / 1e3 * f : 0) }' "$f" >> "$rows"
    done
done

mode="shared memory (plait --np $np; Open MPI btl self,vader; MPICH default)"
((use_netns)) && mode="two network namespaces over a veth pair (plait TCP sockets; Open MPI btl tcp; MPICH UCX_TLS=tcp,self)"

table=$out/table.md
ok_libs=()
for l in "${libs[@]}"; do ((lib_ok[$l])) && ok_libs+=("$l"); done
awk -v libs="${ok_libs[*]}" -v n="$np" -v triad="$triad" -v coll="$coll" -v iperf="${iperf_bw:-0}" '
function median(arr, cnt,   i, j, t) {
    for (i = 2; i <= cnt; i++) { t = arr[i]; for (j = i - 1; j >= 1 && arr[j] > t; j--) arr[j + 1] = arr[j]; arr[j + 1] = t }
    return cnt % 2 ? arr[(cnt + 1) / 2] : (arr[cnt / 2] + arr[cnt / 2 + 1]) / 2
}
function fmt(v) { return v >= 100 ? sprintf("%.0f", v) : v >= 1 ? sprintf("%.2f", v) : sprintf("%.3g", v) }
function human(b) {
    if (b >= 1073741824 && b % 1073741824 == 0) return (b / 1073741824) " GiB"
    if (b >= 1048576 && b % 1048576 == 0) return (b / 1048576) " MiB"
    if (b >= 1024 && b % 1024 == 0) return (b / 1024) " KiB"
    return b " B"
}
{ key = $1 SUBSEP $2; cnt[key]++; tm[key, cnt[key]] = $3; bw[key, cnt[key]] = $4; if (!($2 in seen)) { seen[$2] = 1; sizes[++ns] = $2 + 0 } }
END {
    nl = split(libs, L, " ")
    if (coll == "allreduce") f = (n - 1) / (n * n)
    else if (coll == "allgather" || coll == "reducescatter") f = (n - 1) / (n * (n + 1))
    else if (coll == "broadcast" || coll == "reduce") f = 1 / (n + 1)
    else if (coll == "alltoall") f = (n - 1) / (2 * n * n)
    else f = 1 / (2 * n)
    bound = triad * f
    hdr = "| size | metric |"; sep = "|---:|:---|"
    for (i = 1; i <= nl; i++) { hdr = hdr " " L[i] " |"; sep = sep "---:|" }
    for (i = 2; i <= nl; i++) { hdr = hdr " plait/" L[i] " |"; sep = sep "---:|" }
    if (nl > 2) { hdr = hdr " plait/best |"; sep = sep "---:|" }
    hdr = hdr " plait/bound |"; sep = sep "---:|"
    if (iperf > 0) { hdr = hdr " iperf3 |"; sep = sep "---:|"; for (i = 2; i <= nl; i++) { hdr = hdr " " L[i] "/iperf3 |"; sep = sep "---:|" }; hdr = hdr " plait/iperf3 |"; sep = sep "---:|" }
    print hdr; print sep
    for (s = 1; s <= ns; s++) for (t = s + 1; t <= ns; t++) if (sizes[t] < sizes[s]) { x = sizes[s]; sizes[s] = sizes[t]; sizes[t] = x }
    for (s = 1; s <= ns; s++) {
        sz = sizes[s]; is_lat = sz <= 64
        line = "| " human(sz) " | " (is_lat ? "latency us" : "busbw GB/s") " |"
        for (i = 1; i <= nl; i++) {
            key = L[i] SUBSEP sz; c = cnt[key]; delete a
            for (k = 1; k <= c; k++) a[k] = is_lat ? tm[key, k] : bw[key, k]
            med[i] = c ? median(a, c) : -1
            line = line (c ? " " fmt(med[i]) " |" : " - |")
        }
        best = 0
        for (i = 2; i <= nl; i++) {
            # Always a speed ratio: above 1 means plait is faster.
            r = -1
            if (med[1] > 0 && med[i] > 0) r = is_lat ? med[i] / med[1] : med[1] / med[i]
            line = line (r > 0 ? " " fmt(r) " |" : " - |")
            if (med[i] > 0 && (best == 0 || (is_lat ? med[i] < best : med[i] > best))) best = med[i]
        }
        if (nl > 2) {
            r = (med[1] > 0 && best > 0) ? (is_lat ? best / med[1] : med[1] / best) : -1
            line = line (r > 0 ? " " fmt(r) " |" : " - |")
        }
        line = line ((!is_lat && med[1] > 0 && bound > 0) ? " " fmt(med[1] / bound) " |" : " - |")
        if (iperf > 0) {
            # The link limit only means something for busbw rows.
            line = line (is_lat ? " - |" : " " fmt(iperf) " |")
            for (i = 2; i <= nl; i++) line = line ((!is_lat && med[i] > 0) ? " " fmt(med[i] / iperf) " |" : " - |")
            line = line ((!is_lat && med[1] > 0) ? " " fmt(med[1] / iperf) " |" : " - |")
        }
        print line
    }
    printf("\nbound = %.2f GB/s busbw (triad %.2f GB/s x %s, n = %d)\n", bound, triad, \
           coll == "allreduce" ? "(n-1)/n^2" : coll ~ /allgather|reducescatter/ ? "(n-1)/(n(n+1))" : \
           coll ~ /broadcast|reduce/ ? "1/(n+1)" : coll == "alltoall" ? "(n-1)/(2n^2)" : "1/(2n)", n)
}' "$rows" > "$table"

{
    echo "## $coll, $np ranks, $mode"
    echo
    echo "$(date -u -r "$out/membw.txt" '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo))," \
         "$rounds rounds alternating, median of rounds; -n $iters -w $warmup (below $((small_cut / 1024)) KiB: -n $small_iters -w $small_warmup), float sum, out of place;" \
         "triad 1 thread ${triad1:-?} GB/s, $bw_threads threads $triad GB/s"
    echo
    cat "$table"
    echo
    echo "plait/peer and plait/best are speed ratios (> 1: plait faster): busbw ratio, or peer time / plait time" \
         "for latency rows. busbw = size / time x $busbw_factor (n = $np). Raw outputs: $out"
    if [[ -n $iperf_bw ]]; then
        echo
        echo "iperf3 --bidir on the same veth: $iperf_bw GB/s per direction (median of rounds of the two directions' mean;" \
             "rounds, one way/other way: $iperf_all). The columns <lib>/iperf3 compare busbw with it" \
             "(for 2-rank allreduce, busbw is the bytes each rank sends per second)."
    fi
} | tee "$out/summary.md"

# ---------------------------------------------------------------- plot

if [[ -n $plot ]]; then
    gp=$out/plot.gp
    {
        echo "set terminal png size 900,560"
        echo "set output '$plot'"
        echo "set logscale x 2"
        echo 'set xtics ("8 B" 8, "64 B" 64, "512 B" 512, "4 KiB" 4096, "32 KiB" 32768, "256 KiB" 262144, "2 MiB" 2097152, "16 MiB" 16777216, "128 MiB" 134217728, "1 GiB" 1073741824)'
        echo "set xlabel 'size (bytes)'"
        echo "set ylabel 'busbw (GB/s), median of $rounds rounds'"
        echo "set title '$coll, $np ranks$( ((use_netns)) && echo ', netns')'"
        echo "set key left top"
        echo "set grid"
        printf "plot "
        sep=""
        for l in "${ok_libs[@]}"; do
            # Median busbw per size of this library.
            awk -v l="$l" '$1 == l { print $2, $4 }' "$rows" | sort -k1,1n -k2,2g |
                awk '{ s[$1] = s[$1] " " $2; c[$1]++ } END { for (k in s) { n = split(s[k], v, " ");
                     m = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2; print k, m } }' |
                sort -k1,1n > "$out/plot.$l.dat"
            printf "%s'%s' using 1:2 with linespoints title '%s'" "$sep" "$out/plot.$l.dat" "$l"
            sep=", "
        done
        echo
    } > "$gp"
    timeout 120 gnuplot "$gp" || die "gnuplot failed on $gp"
    note "plot written to $plot"
fi

if ((${#failures[@]})); then
    for f in "${failures[@]}"; do echo "compare.sh: FAILED: $f" >&2; done
    exit 1
fi
