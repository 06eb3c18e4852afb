#!/bin/sh
# Rewrites a binary's list file from its --list (tests/lists/check.py --update):
#   tests/lists/update.sh build/tests/test_collectives
# Kept lines keep their words; new tests get the words of their suite's first
# registered line; vanished tests are dropped. Review the diff, then reconfigure.
set -eu
[ $# -eq 1 ] || { echo "usage: $0 BINARY" >&2; exit 2; }
here=$(dirname "$0")
exec python3 "$here/check.py" --update "$1" "$here/$(basename "$1").txt"
