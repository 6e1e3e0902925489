#!/usr/bin/env bash
# Session 52, call 1 (nvidia-h200-x2; the 4-GPU kind not lent). Does laying out the peers' rows while the links
# still carry rows pay on H200s? Both designs that did so lost on H100s (docs/moe.md, "Not done yet"), where the
# layout's HBM traffic bounds the dispatch at 4096 tokens; an H200's HBM is 1.4 times faster, its NVLink the same.
# The two designs' trees, as committed, are unpacked under build/old/ (git archive of tritoncomm/, scripts/ and
# benchmarks/experiments/): interleave = e8971b8 (MoEShape.interleave), roles = fbd844e (MoEShape.routed_senders).
# (1) MoE GPU tests of MoEShape.pairs_across at world 2 (first GPU run of that code).
# (2) Stage stamps at 4096 tokens per rank on the present tree (moe_trace.py): the send phase and the layout after
#     the barrier on H200s (only H100 stamps exist: send 160 µs, layout 100 µs, DeepSeek-V3).
# (3) Dispatch alone (--op dispatch), in turn with each tree's default, 2 rounds, 512 / 2048 / 4096 tokens.
# Prediction: (2) DeepSeek-V3 send about 150 µs (the link at about 390 GB/s), layout after the barrier about 75.
# (3) interleave 5-15 µs less at 4096 tokens for DeepSeek-V3 (H100: 4 less for both phases), more at 512;
# roles (half the programs send) within 2% at 4096 (H100: 2.6% slower for both phases).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 60 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "paired_across" 2>&1 | tail -2
T=benchmarks/experiments/moe_trace.py
for s in deepseek-v3 qwen3-moe; do
  timeout 70 python3 $T --world 2 --tokens 4096 --shape $s --heap-gb 8 --json "$OUT/trace-$s.json" \
    > "$OUT/trace-$s.log" 2>&1; echo "trace $s rc $?"
done
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 2 --op dispatch"
for s in deepseek-v3 qwen3-moe; do
  (cd build/old/interleave && timeout 100 $M --shape $s --tokens 512,2048,4096 --variants default,interleave=1 \
    --json "$OUT/interleave-$s.json" > "$OUT/interleave-$s.log" 2>&1; echo "interleave $s rc $?")
  (cd build/old/roles && timeout 90 $M --shape $s --tokens 512,4096 --variants default,routed_senders=-1 \
    --json "$OUT/roles-$s.json" > "$OUT/roles-$s.log" 2>&1; echo "roles $s rc $?")
done
for f in "$OUT"/trace-*.log; do echo "== $f"; grep -A 14 "rank 0" "$f" | head -16 || tail -4 "$f"; done
for f in "$OUT"/interleave-*.log "$OUT"/roles-*.log; do echo "== $f"; tail -5 "$f"; done
