#!/usr/bin/env bash
# For a later call (written in session 51, not run: the device minutes were spent), on nvidia-h200-x4:
# (1) MoEShape.pairs_across (the routed layout takes a program's rows of all peers as one sequence, two at a time;
# gather.lay_out_across). At EP4 a program lays out 3-6 peer rows at 384 tokens one after another (session 51
# call 2: its first row starts 4.1 µs after the barrier, the layout ends 15.5 µs after it at the median, 25 at the
# latest); pairs put two rows' rounds of loads in flight together (the paired layout, within one source, took
# 1-2% off at 1024-4096 tokens at EP2).
# (2) The paired layout at EP4: compiled in for instances of 528 tokens and more, it makes the routed send kernel
# spill under the prefill register cap at EP4 and EP8 (offline sm_90 builds: stack 64 bytes at EP4 DeepSeek-V3,
# 104 at EP8; none without it, none at EP2); it was only ever measured at EP2.
# Prediction: (1) EP4 3-6 µs less at Qwen3-MoE 256-512 and DeepSeek-V3 256-384 (DeepSeek-V3 256 under (c)'s 97.7);
# EP2 within 1 µs. (2) paired_layout=0 within 1% at EP4 1024 and 4096 (the spill is to L1-cached local memory).
set -uo pipefail
source scripts/gpu_env.sh
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=4 timeout 100 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "paired_across or two_kernel_dispatch" 2>&1 | tail -2
V="benchmarks/experiments/moe_variants.py --rounds 2"
timeout 130 python3 $V --world 4 --shape qwen3-moe --tokens 256,384,512 --variants default,pairs_across=1 2>&1 | tail -4
timeout 110 python3 $V --world 4 --shape deepseek-v3 --tokens 256,384 --variants default,pairs_across=1 2>&1 | tail -3
CUDA_VISIBLE_DEVICES=0,1 timeout 90 python3 $V --world 2 --shape qwen3-moe --tokens 384,1024 \
  --variants default,pairs_across=1 2>&1 | tail -3
timeout 130 python3 $V --world 4 --shape deepseek-v3 --tokens 1024,4096 --heap-gb 8 \
  --variants default,paired_layout=0 2>&1 | tail -3
