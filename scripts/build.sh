#!/usr/bin/env bash
# Configures (or reconfigures) and builds plait.
#
#   scripts/build.sh [buildtype] [extra meson setup arguments...]
#
# buildtype defaults to release. The build folder is build/, or $BUILD_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

buildtype=${1:-release}
(($# > 0)) && shift
builddir=${BUILD_DIR:-build}

if [ -f "$builddir/meson-private/coredata.dat" ]; then
    log=$(mktemp)
    trap 'rm -f "$log"' EXIT
    if ! meson setup --reconfigure "$builddir" --buildtype "$buildtype" "$@" 2>&1 | tee "$log"; then
        # Only a folder from an incompatible meson version is wiped; any other
        # configure error is the project's and stays an error.
        grep -q -- "--wipe" "$log" || exit 1
        meson setup --wipe "$builddir" --buildtype "$buildtype" "$@"
    fi
else
    meson setup "$builddir" --buildtype "$buildtype" "$@"
fi
ninja -C "$builddir"
