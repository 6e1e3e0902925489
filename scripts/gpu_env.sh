# Sourced by the gpu_*.sh scripts: the repository root, no NVLink multicast, the checkout on the
# path, $OUT for results (default ./gpu-out), $NGPU and $WORLDS (default: 2 and every GPU).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
WORLDS=${WORLDS:-$(printf '%s\n' 2 "$NGPU" | sort -nu | tr '\n' ' ')}
