#!/usr/bin/env bash
# Symbol and linkage check of plait's libnccl.so.2 (issue 4, parts 1 and 6c).
#
#   tests/nccl/symbols.sh OURS [REFERENCE]
#
# OURS is plait's libnccl.so.2; REFERENCE is NVIDIA's (NCCL 2.28), normally
# /usr/local/cuda/lib64/libnccl.so.2. Checks, each printed on its own line:
#   - every function (T/W) of the reference named nccl* or pnccl* is exported by
#     ours as a function, with the same binding (ncclX weak, pncclX strong);
#   - where the reference makes ncclX an alias of pncclX (same address), so does
#     ours, so that a profiler that interposes ncclX and calls pncclX reaches
#     the real call and not itself;
#   - ours exports nothing but nccl*/pnccl* functions (and its version node);
#   - every ncclX of ours has its pncclX twin;
#   - ours has the soname libnccl.so.2 and reaches plait through libplait.so.0
#     (NEEDED, found by its RUNPATH) instead of embedding a copy.
# Without a reference (no CUDA toolkit) the checks on ours alone still run;
# if they pass, the script exits 77 (meson: skipped) and says why.
# Exit status: 0 all passed, 1 a check failed, 77 reference absent.
set -uo pipefail

ours=${1:?usage: symbols.sh OURS [REFERENCE]}
ref=${2:-}
failed=0

fail() {
    echo "FAIL: $*"
    failed=1
}

for tool in nm readelf; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "SKIP: $tool (binutils) is not installed"
        exit 77
    fi
done
if [ ! -f "$ours" ]; then
    fail "$ours does not exist"
    exit 1
fi

# "TYPE NAME ADDRESS" per defined dynamic symbol; the version suffix (@@NODE)
# that nm prints for versioned symbols is dropped.
dyn_symbols() {
    nm -D --defined-only "$1" | awk '
        NF == 3 { name = $3; sub(/@.*/, "", name); print $2, name, $1 }
        NF == 2 { name = $2; sub(/@.*/, "", name); print $1, name, "-" }'
}

ours_syms=$(dyn_symbols "$ours")
if [ -z "$ours_syms" ]; then
    fail "nm -D found no symbols in $ours"
    exit 1
fi

# --- ours alone ---------------------------------------------------------------

# Absolute symbols (type A) are version nodes; everything else must be nccl*/pnccl*
# functions.
extra=$(awk '$1 != "A" && !(($1 == "T" || $1 == "W") && $2 ~ /^p?nccl/) { print $1, $2 }' <<<"$ours_syms")
if [ -n "$extra" ]; then
    while read -r line; do fail "ours exports something outside nccl*/pnccl* functions: $line"; done <<<"$extra"
else
    echo "ok: ours exports only nccl*/pnccl* functions ($(awk '$1 != "A"' <<<"$ours_syms" | wc -l) symbols)"
fi

no_twin=$(awk '($1 == "T" || $1 == "W") { have[$2] = 1 }
               END { for (s in have) if (s ~ /^nccl/ && !have["p" s] && s != "ncclResetDebugInitInternal") print s }' \
    <<<"$ours_syms" | sort)
if [ -n "$no_twin" ]; then
    while read -r s; do fail "ours has $s but not its profiling twin p$s"; done <<<"$no_twin"
else
    echo "ok: every ncclX of ours has its pncclX twin"
fi

soname=$(readelf -d "$ours" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
if [ "$soname" = "libnccl.so.2" ]; then
    echo "ok: soname $soname"
else
    fail "soname is '${soname:-none}', expected libnccl.so.2"
fi
if readelf -d "$ours" | grep -q '(NEEDED).*\[libplait\.so'; then
    echo "ok: ours links libplait.so (NEEDED $(readelf -d "$ours" | sed -n 's/.*(NEEDED).*\[\(libplait[^]]*\)\].*/\1/p'))"
else
    fail "ours does not link libplait.so (it must be a thin layer over it, not a copy)"
fi

# --- against NVIDIA's ---------------------------------------------------------

if [ -z "$ref" ] || [ ! -f "$ref" ]; then
    if [ "$failed" -ne 0 ]; then
        exit 1
    fi
    echo "SKIP: NVIDIA's libnccl.so.2 (${ref:-no path given}) is absent: the comparison with NCCL 2.28's exports was not run"
    exit 77
fi

ref_syms=$(dyn_symbols "$ref")
ref_funcs=$(awk '($1 == "T" || $1 == "W") && $2 ~ /^p?nccl/' <<<"$ref_syms")
nref=$(wc -l <<<"$ref_funcs")

missing=$(awk 'NR == FNR { if ($1 == "T" || $1 == "W") have[$2] = 1; next }
               !have[$2] { print $2 }' <(echo "$ours_syms") <(echo "$ref_funcs") | sort)
nmissing=0
if [ -n "$missing" ]; then
    nmissing=$(wc -l <<<"$missing")
    while read -r s; do fail "missing in ours: $s"; done <<<"$missing"
fi
echo "$([ "$nmissing" -eq 0 ] && echo ok || echo FAIL): $((nref - nmissing)) of NVIDIA's $nref nccl*/pnccl* functions exported by ours, $nmissing missing"

binding=$(awk 'NR == FNR { if ($1 == "T" || $1 == "W") type[$2] = $1; next }
               ($2 in type) && type[$2] != $1 { print $2 " is " type[$2] " in ours, " $1 " in NVIDIA'"'"'s" }' \
    <(echo "$ours_syms") <(echo "$ref_funcs"))
if [ -n "$binding" ]; then
    while read -r line; do fail "binding differs: $line"; done <<<"$binding"
else
    echo "ok: bindings match NVIDIA's (weak ncclX, strong pncclX)"
fi

# Pairs that NVIDIA aliases (ncclX and pncclX at one address) must be aliases
# in ours too.
alias_bad=$(awk 'NR == FNR { if ($1 == "T" || $1 == "W") addr[$2] = $3; next }
                 { ref[$2] = $3 }
                 END { for (s in ref) if (s ~ /^nccl/ && ("p" s) in ref && ref[s] == ref["p" s] &&
                                          (s in addr) && (("p" s) in addr) && addr[s] != addr["p" s])
                           print s }' <(echo "$ours_syms") <(echo "$ref_funcs") | sort)
if [ -n "$alias_bad" ]; then
    while read -r s; do fail "$s and p$s are separate functions in ours (NVIDIA's are one, aliased)"; done <<<"$alias_bad"
else
    echo "ok: every ncclX that NVIDIA aliases to pncclX is an alias in ours too"
fi

exit "$failed"
