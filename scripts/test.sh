#!/usr/bin/env bash
# Installs what is missing, builds, runs the test suite and ends with one line
# "N passed, N failed" (", N skipped" when some were). Exits non-zero if any
# test failed or the build did.
#
#   scripts/test.sh [meson test arguments, e.g. --suite sanitize]
#
# Environment: BUILD_DIR (default build), BUILDTYPE (default release),
# MESON_ARGS (extra `meson setup` arguments, split on spaces).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

builddir=${BUILD_DIR:-build}
read -r -a setup_args <<<"${MESON_ARGS:-}"

if ! ./scripts/deps.sh || ! BUILD_DIR="$builddir" ./scripts/build.sh "${BUILDTYPE:-release}" "${setup_args[@]}"; then
    echo "test.sh: dependencies or build failed" >&2
    echo "0 passed, 1 failed"
    exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
meson test -C "$builddir" --print-errorlogs "$@" 2>&1 | tee "$log"
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

# meson failing without a summary (no tests matched, a broken build folder)
# is a failure too.
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed=1
fi
if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
