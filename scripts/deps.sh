#!/usr/bin/env bash
# Installs the Debian packages plait needs to build and test, and only those
# that are missing: when everything is present it touches nothing (no apt-get
# update, no root needed). Optional packages (UCX, verbs, rdmacm) enable optional
# transports; failing to install them is a warning, not an error.
set -euo pipefail

required=(meson ninja-build pkg-config gcc libhwloc-dev hwloc libcriterion-dev libnuma-dev
          iproute2 valgrind python3 clang libclang-rt-dev)
optional=(libucx-dev libibverbs-dev librdmacm-dev)

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
apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -y -q -o Dpkg::Use-Pty=0)

to_install=("${missing_required[@]}" "${missing_optional[@]}")
echo "deps: installing ${to_install[*]}"
"${apt[@]}" update
if ((${#missing_required[@]} > 0)); then
    "${apt[@]}" install --no-install-recommends "${missing_required[@]}"
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
