#!/usr/bin/env bash
# Installs what is missing, builds, and runs all_reduce_perf on 4 local CPU
# ranks from 8 B to 128 MiB. Extra arguments go to all_reduce_perf (later
# options win, e.g. `scripts/perf.sh -e 1M -d half`).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/deps.sh
./scripts/build.sh
exec "${BUILD_DIR:-build}/perf/all_reduce_perf" --np 4 -b 8 -e 128M -f 2 "$@"
