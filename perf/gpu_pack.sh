#!/usr/bin/env bash
# perf/gpu_pack.sh — prepares perf/gpu_check.sh's run on a lent GPU machine.
#
# Builds plait here with the CUDA backend for sm_90 (H100/H200), then copies
# into .gpucarry/ of the checkout what the bare GPU machine needs: bin/ (the
# device check driver, the three perf tools, gpu_reduce_bw; they link plait
# statically) and lib/ (the shared libraries ldd finds here beyond glibc's,
# such as libhwloc, which that machine lacks). .gpucarry/ ignores itself in
# git (a .gitignore of "*"), so the device tool must be told to carry it.
# Prints the device tool's command.
#
# usage: perf/gpu_pack.sh [BUILD_DIR]   (default: build-gpu in the checkout)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$ROOT/build-gpu}
ARCHS=${GPU_ARCHS:-90}
CARRY=$ROOT/.gpucarry
# Carry is limited to 64 MiB in all.
LIMIT_KB=$((60 * 1024))

if [ -d "$BUILD/meson-private" ]; then
    meson setup --reconfigure "$BUILD" "$ROOT" -Dgpu_archs="$ARCHS" -Dwith_cuda=enabled > "$BUILD.setup.log" 2>&1 ||
        { cat "$BUILD.setup.log"; exit 1; }
else
    meson setup "$BUILD" "$ROOT" -Dgpu_archs="$ARCHS" -Dwith_cuda=enabled --buildtype=release > "$BUILD.setup.log" 2>&1 ||
        { cat "$BUILD.setup.log"; exit 1; }
fi
TARGETS="tests/cuda_device_check perf/all_reduce_perf perf/all_gather_perf perf/reduce_scatter_perf perf/gpu_reduce_bw
    perf/gpu_dead_peer"
# shellcheck disable=SC2086
ninja -C "$BUILD" $TARGETS

rm -rf "$CARRY"
mkdir -p "$CARRY/bin" "$CARRY/lib"
echo '*' > "$CARRY/.gitignore"
for t in $TARGETS; do
    cp "$BUILD/$t" "$CARRY/bin/"
done
strip --strip-debug "$CARRY"/bin/* 2> /dev/null || true

# Libraries beyond the C library's own, which any Linux machine has.
is_base() {
    case "$1" in
        linux-vdso.so.*|ld-linux*|libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|libgcc_s.so.*|libstdc++.so.*|libresolv.so.*) return 0 ;;
        *) return 1 ;;
    esac
}
missing=0
for b in "$CARRY"/bin/*; do
    while read -r name arrow path _; do
        [ "$arrow" = "=>" ] || continue
        is_base "$name" && continue
        if [ "$path" = "not" ]; then
            echo "gpu_pack.sh: $b needs $name, which is not found here" >&2
            missing=1
            continue
        fi
        [ -e "$CARRY/lib/$name" ] || cp -L "$path" "$CARRY/lib/$name"
    done < <(ldd "$b")
done
[ "$missing" = 0 ] || exit 1

if [ -x /usr/local/cuda/bin/cuobjdump ] && [ -f "$BUILD/plait_kernel.fatbin" ]; then
    echo "# kernels in the fatbin:"
    /usr/local/cuda/bin/cuobjdump --list-elf "$BUILD/plait_kernel.fatbin" | sed 's/^/#   /'
fi
echo "# .gpucarry:"
(cd "$CARRY" && ls -l bin lib | sed 's/^/#   /')
kb=$(du -sk "$CARRY" | cut -f1)
echo "# total ${kb} KiB (carry limit 64 MiB)"
if [ "$kb" -gt "$LIMIT_KB" ]; then
    echo "gpu_pack.sh: .gpucarry is too large to carry" >&2
    exit 1
fi
# Here, without a GPU, the check must skip cleanly.
bash "$ROOT/perf/gpu_check.sh" --dry-run > /dev/null
echo "# glibc here: $(ldd --version | head -1)  (the GPU machine needs the same or newer)"
cat <<EOF
# Run on the GPU machine (device tool), one call, then give_back:
#   run(command="bash perf/gpu_check.sh", carry=[".gpucarry"], timeout_s=300)
# A rerun that must be short:
#   run(command="bash perf/gpu_check.sh --quick", carry=[".gpucarry"], timeout_s=200)
EOF
