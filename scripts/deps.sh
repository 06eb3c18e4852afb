#!/usr/bin/env bash
# Installs the Debian packages plait needs to build and test, and only those
# that are missing: when everything is present it touches nothing (no apt-get
# update, no root needed). Optional packages (UCX, verbs, rdmacm) enable optional
# transports; failing to install them is a warning, not an error.
#
#   scripts/deps.sh         what the build, the tools and every test need
#   scripts/deps.sh --ci    and what .ci/run needs besides (debootstrap, for the
#                           fresh-machine stage .ci/fresh.sh)
#
# .ci/fresh.sh runs this script in a bare Debian 12 root (debootstrap
# --variant=minbase) and then builds and tests there: a package missing here
# fails CI. apt is retried on transient failures (a mirror's hiccup).
set -euo pipefail

# Why each is needed (packages are installed without their Recommends):
#   meson ninja-build pkg-config    the build (meson also brings python3)
#   gcc libc6-dev                   the compiler and C library headers (gcc only recommends libc6-dev)
#   libhwloc-dev hwloc              topology discovery; lstopo to record a machine (docs/topology.md)
#   libhwloc-plugins                hwloc's libxml2 XML support (plait reads hwloc XML without it too,
#                                   but hwloc's own diagnostics and other tools need it)
#   libnuma-dev                     NUMA placement
#   libcriterion-dev                the test framework
#   python3                         core/cuda/fatbin_gen.py, the env_doc_in_step test, fixture generators
#   valgrind                        the leak_cycles_valgrind test (suite leaks)
#   clang libclang-rt-dev           tests/fuzz/run.sh (libFuzzer, ASan, UBSan runtimes)
#   binutils                        nm and readelf for tests/nccl/symbols.sh (gcc depends on it)
#   iproute2                        ip and tc: the multi-host tests (tests/multihost/run.sh: namespaces, veth,
#                                   bridge, tbf) and perf/compare.sh
required=(meson ninja-build pkg-config gcc libc6-dev libhwloc-dev hwloc libhwloc-plugins libnuma-dev
          libcriterion-dev python3 valgrind clang libclang-rt-dev binutils iproute2)
optional=(libucx-dev libibverbs-dev librdmacm-dev)

if [ "${1:-}" = --ci ]; then
    required+=(debootstrap)
    shift
fi
if [ $# -gt 0 ]; then
    echo "usage: $0 [--ci]" >&2
    exit 2
fi

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "deps: not a Debian-based system; install the equivalents of: ${required[*]} (optional: ${optional[*]})" >&2
    exit 0
fi

is_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

missing_required=()
missing_optional=()
for p in "${required[@]}"; do is_installed "$p" || missing_required+=("$p"); done
for p in "${optional[@]}"; do is_installed "$p" || missing_optional+=("$p"); done

if ((${#missing_required[@]} == 0 && ${#missing_optional[@]} == 0)); then
    echo "deps: all packages present"
    exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "deps: packages are missing, and this is neither root nor has sudo" >&2
        exit 1
    fi
    sudo=(sudo)
fi
apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -y -q -o Dpkg::Use-Pty=0 -o Acquire::Retries=3)

# Runs apt-get with its arguments up to 3 times: a mirror that is briefly
# unreachable or an index caught mid-update fails one try, not the install.
# A package that does not exist fails all three, in a few seconds.
apt_retry() {
    local attempt
    for attempt in 1 2 3; do
        "${apt[@]}" "$@" && return 0
        if [ "$attempt" -lt 3 ]; then
            echo "deps: apt-get $1 failed (attempt $attempt of 3); retrying in $((attempt * 5)) s" >&2
            sleep $((attempt * 5))
            [ "$1" = install ] && "${apt[@]}" update >/dev/null 2>&1 || true
        fi
    done
    return 1
}

to_install=("${missing_required[@]}" "${missing_optional[@]}")
echo "deps: installing ${to_install[*]}"
apt_retry update
if ((${#missing_required[@]} > 0)); then
    apt_retry install --no-install-recommends "${missing_required[@]}"
fi
if ((${#missing_optional[@]} > 0)); then
    if ! "${apt[@]}" install --no-install-recommends "${missing_optional[@]}"; then
        # One unavailable package must not keep the others out.
        for p in "${missing_optional[@]}"; do
            "${apt[@]}" install --no-install-recommends "$p" ||
                echo "deps: warning: optional package $p not installed; its feature stays off" >&2
        done
    fi
fi
