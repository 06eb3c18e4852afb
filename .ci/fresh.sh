#!/usr/bin/env bash
# The fresh-machine stage: proves that a new Debian 12 machine with nothing but
# what scripts/deps.sh installs builds plait and passes its tests, so that a
# package missing from deps.sh fails CI instead of hiding behind the packages
# this machine already has.
#
#   .ci/fresh.sh            (as root; CI runs it from .ci/run)
#
# 1. A minimal Debian 12 root (debootstrap --variant=minbase bookworm), from the
#    mirror this machine's apt configuration names (read at run time: no
#    mirror's address is written in the repository). The root is cached as a
#    tarball in $PLAIT_FRESH_CACHE (default /var/cache/plait-ci) for 7 days;
#    PLAIT_FRESH_COLD=1 ignores the cache. Only the bare root is cached, never
#    what deps.sh installs into it.
# 2. This machine's apt sources, keyrings and apt.conf.d copied into the root,
#    with /etc/hosts, /etc/hostname and /etc/resolv.conf, and the source tree
#    (git's tracked and untracked-but-not-ignored files) in /src/plait.
# 3. Inside, under `unshare --mount --uts` + chroot, so that a stage killed by
#    its time limit leaves no mount behind (/proc, /sys and /dev are bound in
#    the namespace only; /dev/shm is a tmpfs of its own): the README's two
#    commands, `./scripts/perf.sh` (deps, release build, all_reduce_perf, here
#    on 2 ranks up to 1 MiB) and `./scripts/test.sh` on a quick subset (see
#    FRESH_SUITES and FRESH_NAMES), then tests/fuzz/run.sh for 5 s (clang and its libFuzzer
#    runtime). No CUDA toolkit is there: the NCCL-reference tests must skip
#    with their reason, and a skip of any other test fails the stage (a test
#    that skips because a package is missing hides that package).
#
# The last line is "N passed, N failed": the subset's meson tests, plus one
# each for the perf run, the fuzz run and the skip check. Exit status non-zero
# on any failure.
set -uo pipefail

SUITE=bookworm
# The quick subset: the unit tests (topology, bootstrap over localhost,
# reductions, the tuner, the schedule verifier, plait-info's table in
# docs/env.md) but the CUDA double's and plait_verify_all, the public API, the
# small collectives matrix on threads, shm and sockets, the leak check under
# valgrind, the NCCL tests (which skip without the toolkit), a real-GPU test
# (which says "no CUDA device" and skips) and one on the CUDA test double.
FRESH_SUITES=(--suite unit --suite nccl --no-suite cuda)
# Of those, not the long sweep of plait-verify --all (minutes; it needs no package).
FRESH_LEAVE_OUT='^(plait_verify_all)$'
FRESH_NAMES=(test_api collectives_small_threads_3 collectives_small_shm_4 collectives_small_socket_2
             leak_cycles_valgrind cuda_device_threads_1 cuda_host_matrix_2_double)

# Skips allowed in the root: the tests that need NVIDIA's toolkit (none there).
ALLOWED_SKIPS='^nccl_'

fail_early() {
    echo "fresh: $*" >&2
    echo "0 passed, 1 failed"
    exit 1
}

# ------------------------------------------------------------------ inside the root
if [ "${1:-}" = --inside ]; then
    cd /src/plait || fail_early "no /src/plait in the root"
    passed=0
    failed=0
    step() { echo "==> fresh: $*"; }
    now() { date +%s; }

    t0=$(now)
    step "./scripts/perf.sh (deps.sh, release build, all_reduce_perf on 2 ranks)"
    if ./scripts/perf.sh --np 2 -e 1M -n 5 -w 1 -c 1 -T 120; then
        passed=$((passed + 1))
    else
        echo "fresh: FAILED: ./scripts/perf.sh"
        failed=$((failed + 1))
    fi
    echo "==> fresh: perf.sh took $(($(now) - t0)) s"

    t0=$(now)
    # meson takes either names or suites: the suites' tests by name.
    mapfile -t subset < <(meson test -C build --list --no-rebuild "${FRESH_SUITES[@]}" 2>/dev/null |
        sed -n 's/^[^ ]* \/ //p' | grep -v -E "$FRESH_LEAVE_OUT")
    step "./scripts/test.sh (${#subset[@]} tests of ${FRESH_SUITES[*]}, and ${FRESH_NAMES[*]})"
    log=$(mktemp)
    ./scripts/test.sh "${subset[@]}" "${FRESH_NAMES[@]}" 2>&1 | tee "$log"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [[ $line =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
        passed=$((passed + BASH_REMATCH[1]))
        failed=$((failed + BASH_REMATCH[2]))
    else
        failed=$((failed + 1))
    fi
    echo "==> fresh: test.sh took $(($(now) - t0)) s"

    # meson prints "N/M project:suites / name   SKIP   0.01s" for each skip.
    skipped=$(awk '{ for (i = 1; i + 2 <= NF; i++) if ($i == "/") { if ($(i+2) == "SKIP") print $(i+1); break } }' "$log")
    unexpected=$(printf '%s\n' "$skipped" | grep -v -E "$ALLOWED_SKIPS" | grep -v '^$')
    if [ -n "$unexpected" ]; then
        echo "fresh: FAILED: tests skipped on a fresh machine (a package deps.sh does not install?):"
        printf '    %s\n' $unexpected
        failed=$((failed + 1))
    else
        echo "fresh: skips: $(printf '%s ' $skipped)(allowed: no CUDA toolkit)"
        passed=$((passed + 1))
    fi

    t0=$(now)
    step "tests/fuzz/run.sh 5"
    if tests/fuzz/run.sh 5; then
        passed=$((passed + 1))
    else
        echo "fresh: FAILED: tests/fuzz/run.sh (status $?)"
        failed=$((failed + 1))
    fi
    echo "==> fresh: fuzz took $(($(now) - t0)) s"
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
fi

# ------------------------------------------------------------------ outside
cd "$(dirname "$0")/.." || exit 1
SRC=$(pwd)
[ "$(id -u)" -eq 0 ] || fail_early "must run as root (debootstrap, chroot, unshare)"
for tool in debootstrap unshare chroot tar; do
    command -v "$tool" >/dev/null 2>&1 || fail_early "$tool is not installed (CI installs it: scripts/deps.sh --ci)"
done

# The first deb source for $SUITE in this machine's apt configuration, in
# deb822 (*.sources) or one-line (sources.list, *.list) form.
find_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk -v suite="$SUITE" '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") && enabled != "no" && uri != "")
                    { print uri; found = 1; exit }
                types = suites = uri = enabled = ""
            }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            {
                key = tolower($1); sub(/:$/, "", key)
                if (key == "types:" || key == "types") { $1 = ""; types = $0 }
                else if (key == "suites") { $1 = ""; suites = $0 }
                else if (key == "uris") { uri = $2 }
                else if (key == "enabled") { enabled = tolower($2) }
            }
            END { if (!found) flush() }' "$f" | head -n 1 | grep . && return 0
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        awk -v suite="$SUITE" '
            $1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while ($i !~ /\]$/ && i < NF) i++; i++ }
                if ($(i+1) == suite) { print $i; exit }
            }' "$f" | head -n 1 | grep . && return 0
    done
    return 1
}

mirror=$(find_mirror) || fail_early "no 'deb' source for $SUITE in /etc/apt/sources.list or /etc/apt/sources.list.d/"
echo "fresh: mirror (from this machine's apt configuration): $mirror"

cache_dir=${PLAIT_FRESH_CACHE:-/var/cache/plait-ci}
cache=$cache_dir/$SUITE-minbase-$(printf '%s' "$mirror" | md5sum | cut -c1-12).tar

# Roots of runs that were killed before their trap ran: no mount of theirs is
# left (the mounts lived in their namespace), only files.
for old in /var/tmp/plait-fresh.*; do
    [ -d "$old" ] || continue
    pid=$(cat "$old/pid" 2>/dev/null)
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
        rm -rf --one-file-system "$old"
    fi
done
work=$(mktemp -d /var/tmp/plait-fresh.XXXXXX) || fail_early "cannot make a work folder in /var/tmp"
echo $$ >"$work/pid"
# Nothing is ever mounted in this (the outer) namespace, so removing the root
# cannot reach through a bind mount.
trap 'rm -rf --one-file-system "$work"' EXIT
root=$work/root
t_start=$(date +%s)

if [ "${PLAIT_FRESH_COLD:-0}" != 1 ] && [ -n "$(find "$cache" -mtime -7 2>/dev/null)" ]; then
    echo "fresh: minbase root from the cache $cache"
    mkdir -p "$root" && tar -C "$root" -xf "$cache" || fail_early "cannot unpack $cache"
else
    ok=0
    for attempt in 1 2 3; do
        rm -rf --one-file-system "$root"
        echo "fresh: debootstrap --variant=minbase $SUITE (attempt $attempt)"
        if debootstrap --variant=minbase "$SUITE" "$root" "$mirror" >"$work/debootstrap.log" 2>&1; then
            ok=1
            break
        fi
        tail -n 20 "$work/debootstrap.log"
        sleep $((attempt * 10))
    done
    [ "$ok" = 1 ] || fail_early "debootstrap failed 3 times"
    rm -rf "$root"/var/cache/apt/archives/*.deb
    if mkdir -p "$cache_dir" && tar -C "$root" -cf "$cache.tmp.$$" . && mv "$cache.tmp.$$" "$cache"; then
        echo "fresh: cached the minbase root in $cache"
    else
        rm -f "$cache.tmp.$$"
        echo "fresh: warning: could not cache the root in $cache_dir"
    fi
fi
echo "fresh: root ready in $(($(date +%s) - t_start)) s"

# This machine's apt configuration, so that the root reaches the same mirror
# with the same settings (proxies, retries, validity checks).
rm -f "$root/etc/apt/sources.list"
mkdir -p "$root/etc/apt/sources.list.d" "$root/etc/apt/apt.conf.d" "$root/etc/apt/trusted.gpg.d" \
    "$root/etc/apt/keyrings"
[ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list "$root/etc/apt/"
for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && cp "$f" "$root/etc/apt/sources.list.d/"
done
for d in apt.conf.d trusted.gpg.d keyrings; do
    for f in /etc/apt/$d/*; do
        [ -f "$f" ] && cp "$f" "$root/etc/apt/$d/"
    done
done
# Keyrings the sources name by path (Signed-By, signed-by=) that the root lacks.
grep -h -o -i -E 'signed-by[:=] *[^] ]+' "$root"/etc/apt/sources.list "$root"/etc/apt/sources.list.d/* 2>/dev/null |
    sed -E 's/^[^:=]*[:=] *//' | sort -u | while read -r key; do
        if [ -f "$key" ] && [ ! -e "$root$key" ]; then
            mkdir -p "$root$(dirname "$key")" && cp "$key" "$root$key"
        fi
    done
cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
printf '127.0.0.1\tlocalhost\n127.0.1.1\tplait-fresh\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
echo plait-fresh >"$root/etc/hostname"

mkdir -p "$root/src/plait"
if git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$SRC" && git ls-files -z --cached --others --exclude-standard |
        tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -C "$root/src/plait" -xf - ||
        fail_early "cannot copy the source tree into the root"
else
    tar -C "$SRC" --exclude='./build*' -cf - . | tar -C "$root/src/plait" -xf - ||
        fail_early "cannot copy the source tree into the root"
fi

# The mounts exist only in the new namespace: when its last process ends
# (normally, or killed by the stage's limit) they are gone.
unshare --mount --uts --propagation private -- /bin/bash -c '
    set -e
    r=$1
    mount -t proc proc "$r/proc"
    mount --rbind /sys "$r/sys"
    mount --rbind /dev "$r/dev"
    mount -t tmpfs -o mode=1777,size=50% tmpfs "$r/dev/shm"
    hostname plait-fresh
    exec chroot "$r" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/root LANG=C.UTF-8 CI=true TERM=dumb /bin/bash /src/plait/.ci/fresh.sh --inside
' fresh "$root"
rc=$?
echo "fresh: the whole stage took $(($(date +%s) - t_start)) s"
exit "$rc"
