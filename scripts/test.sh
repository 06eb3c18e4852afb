#!/usr/bin/env bash
# Installs what is missing, builds, runs the test suite and ends with one line
# "N passed, N failed" (", N skipped" when some were). Exits non-zero if any
# test failed or the build did.
#
#   scripts/test.sh [--no-build] [meson test arguments, e.g. --suite sanitize]
#
# With no argument it runs every test. --no-build runs the tests of the
# existing build folder as they are: no deps.sh, no (re)build (.ci/run builds
# once, then runs its stages this way).
#
# Environment: BUILD_DIR (default build), BUILDTYPE (default release),
# MESON_ARGS (extra `meson setup` arguments, split on spaces).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

builddir=${BUILD_DIR:-build}
read -r -a setup_args <<<"${MESON_ARGS:-}"

no_build=0
if [ "${1:-}" = --no-build ]; then
    shift
    no_build=1
    if [ ! -f "$builddir/build.ninja" ]; then
        echo "test.sh: --no-build: $builddir is not a configured build folder" >&2
        echo "0 passed, 1 failed"
        exit 1
    fi
elif ! ./scripts/deps.sh || ! BUILD_DIR="$builddir" ./scripts/build.sh "${BUILDTYPE:-release}" "${setup_args[@]}"; then
    echo "test.sh: dependencies or build failed" >&2
    echo "0 passed, 1 failed"
    exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# --no-rebuild with --no-build: meson would otherwise run ninja first.
no_rebuild=()
[ "${no_build:-0}" = 1 ] && no_rebuild=(--no-rebuild)
meson test -C "$builddir" --print-errorlogs "${no_rebuild[@]}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

# meson's summary: "Ok:", "Expected Fail:", "Fail:", "Unexpected Pass:",
# "Skipped:", "Timeout:", each followed by a count.
read -r passed failed skipped < <(awk '
    /^Ok:/              { ok = $2 }
    /^Expected Fail:/   { xfail = $3 }
    /^Fail:/            { fail = $2 }
    /^Unexpected Pass:/ { xpass = $3 }
    /^Timeout:/         { timeout = $2 }
    /^Skipped:/         { skip = $2 }
    END { print ok + xfail, fail + xpass + timeout, skip + 0 }' "$log")

# meson failing without a summary (a broken build folder), or running no test
# at all (arguments that match none: "No suitable tests defined."), is a
# failure too.
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed=1
fi
if [ $((passed + failed + skipped)) -eq 0 ]; then
    echo "test.sh: no test ran" >&2
    failed=1
fi
if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
