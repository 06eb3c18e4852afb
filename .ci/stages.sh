#!/usr/bin/env bash
# The test stages of .ci/run: which meson tests each runs, and a check that
# every test of the build is in exactly one stage.
#
#   .ci/stages.sh names               the stages, in order, with their limits ("NAME LIMIT" lines)
#   .ci/stages.sh args NAME           the `meson test` arguments of stage NAME (one a line)
#   .ci/stages.sh check BUILD_DIR     each test of BUILD_DIR in exactly one stage; ends "N passed, N failed"
#
# A test belongs to the first stage in STAGES whose suite it is in; the last
# stage, rest, takes every test no earlier stage took. So a test is never run
# twice nor left out, and a new test (or a new suite) needs no change here: one
# labelled 'unit' runs in unit, 'behaviour' in behaviour, one only in
# 'sanitize' (or a suite of its own) in rest.
set -uo pipefail

# NAME LIMIT_SECONDS SUITE   (limits: docs/testing.md, section 4, with the measured costs)
STAGES=(
    "cuda 300 cuda"
    "nccl 120 nccl"
    "collectives 180 collectives"
    "multihost 360 multihost"
    "algorithms 300 algorithms"
    "unit 480 unit"
    "behaviour 300 behaviour"
    "rest 300 -"
)

stage_args() {
    local want=$1 entry name limit suite earlier=()
    for entry in "${STAGES[@]}"; do
        read -r name limit suite <<<"$entry"
        if [ "$name" = "$want" ]; then
            [ "$suite" != - ] && printf '%s\n' --suite "$suite"
            for s in "${earlier[@]}"; do printf '%s\n' --no-suite "$s"; done
            return 0
        fi
        [ "$suite" != - ] && earlier+=("$suite")
    done
    echo "stages: no stage $want" >&2
    return 1
}

# The test names `meson test --list` prints for the given arguments.
list_tests() {
    local dir=$1
    shift
    meson test -C "$dir" --list "$@" 2>/dev/null | sed -n 's/^[^ ]* \/ //p' | sort
}

case ${1:-} in
names)
    for entry in "${STAGES[@]}"; do
        read -r name limit _ <<<"$entry"
        echo "$name $limit"
    done
    ;;
args)
    [ $# -eq 2 ] || { echo "usage: $0 args NAME" >&2; exit 2; }
    stage_args "$2"
    ;;
check)
    [ $# -eq 2 ] || { echo "usage: $0 check BUILD_DIR" >&2; exit 2; }
    dir=$2
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    list_tests "$dir" >"$tmp/all"
    if [ ! -s "$tmp/all" ]; then
        echo "stages: meson test -C $dir --list shows no test"
        echo "0 passed, 1 failed"
        exit 1
    fi
    : >"$tmp/union"
    for entry in "${STAGES[@]}"; do
        read -r name _ _ <<<"$entry"
        mapfile -t args < <(stage_args "$name")
        list_tests "$dir" "${args[@]}" >"$tmp/$name"
        echo "stages: $name: $(wc -l <"$tmp/$name") tests"
        cat "$tmp/$name" >>"$tmp/union"
    done
    sort "$tmp/union" -o "$tmp/union"
    twice=$(uniq -d "$tmp/union")
    never=$(comm -23 "$tmp/all" <(sort -u "$tmp/union"))
    unknown=$(comm -13 "$tmp/all" <(sort -u "$tmp/union"))
    bad=0
    [ -n "$twice" ] && { echo "stages: in more than one stage:" $twice; bad=1; }
    [ -n "$never" ] && { echo "stages: in no stage:" $never; bad=1; }
    [ -n "$unknown" ] && { echo "stages: in a stage but not in the build:" $unknown; bad=1; }
    if [ "$bad" -eq 0 ]; then
        echo "stages: each of the $(wc -l <"$tmp/all") tests is in exactly one stage"
        echo "1 passed, 0 failed"
    else
        echo "0 passed, 1 failed"
    fi
    exit "$bad"
    ;;
*)
    echo "usage: $0 names | args NAME | check BUILD_DIR" >&2
    exit 2
    ;;
esac
