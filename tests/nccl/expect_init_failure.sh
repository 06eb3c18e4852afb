#!/usr/bin/env bash
# The control of the LD_PRELOAD test (issue 4, part 6a): the user's program,
# linked against NVIDIA's libnccl.so.2 and run WITHOUT LD_PRELOAD, must fail at
# init on a machine without a GPU (exit status 3 of nccl_app: ncclGetUniqueId or
# ncclCommInitRank failed). That shows that the same binary passing under
# LD_PRELOAD was served by plait, not by NVIDIA's library. With a GPU present the
# control says nothing, so it is skipped with a message.
#
#   tests/nccl/expect_init_failure.sh NCCL_APP [NRANKS]
set -uo pipefail
app=${1:?usage: expect_init_failure.sh NCCL_APP [NRANKS]}
nranks=${2:-2}

if ls /dev/nvidia[0-9]* >/dev/null 2>&1 || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }; then
    echo "SKIP: a GPU is present: NVIDIA's NCCL may initialize here, so its failure cannot be the control"
    exit 77
fi

unset LD_PRELOAD
"$app" "$nranks"
rc=$?
case $rc in
    3) echo "ok: without LD_PRELOAD, NVIDIA's libnccl.so.2 failed at init (no GPU), as expected"; exit 0 ;;
    0) echo "FAIL: without LD_PRELOAD the program passed: NVIDIA's NCCL ran on host buffers, or $app is not linked against it"; exit 1 ;;
    *) echo "FAIL: without LD_PRELOAD the program exited with $rc, expected 3 (init failed)"; exit 1 ;;
esac
