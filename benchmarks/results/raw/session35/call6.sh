#!/usr/bin/env bash
# Session 35, call 6 (2 GPUs), tree 33a699a, the same machine as call 5: tune --op moe for
# DeepSeek-V3 at EP2 (the command as given to the device; OUT is the call's output folder).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PHASES=tune SHAPES=deepseek-v3 TUNE_TIMEOUT=200 OUT=$OUT bash scripts/gpu_moe.sh
