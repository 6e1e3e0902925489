# Sourced by the gpu_*.sh scripts: the repository root, no NVLink multicast, the checkout on the
# path, $OUT for results (default ./gpu-out), $NGPU and $WORLDS (default: 2 and every GPU).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
WORLDS=${WORLDS:-$(printf '%s\n' 2 "$NGPU" | sort -nu | tr '\n' ' ')}
# FlashInfer, the peers' baseline (../shared/peers/README.md): where a copy of that folder is carried
# as .peers, its one wheel goes under /tmp and the benchmarks' peer columns import it.
if [ -d .peers/flashinfer ] && [ -z "${TRITONCOMM_PEERS_READY:-}" ]; then
  python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/peers-site .peers/whl/*.whl \
    || echo "gpu_env.sh: the peers' wheel did not install; their columns will say why"
  export PYTHONPATH=$PYTHONPATH:/tmp/peers-site:$PWD/.peers TRITONCOMM_PEERS_READY=1
  export FLASHINFER_CONFIDENTIAL_COMPUTE=1 FLASHINFER_CUDA_ARCH_LIST=9.0a TVM_FFI_DISABLE_TORCH_C_DLPACK=1 \
    FLASHINFER_WORKSPACE_BASE=/tmp/fi FLASHINFER_DISABLE_VERSION_CHECK=1
fi
