#!/usr/bin/env bash
# For the next 4-GPU call (written in session 49, not run: the device minutes were spent): stage stamps of every
# call of the slow replays (moe_stalls.py --trace: one row of stamps per call of the graph). EP4, Qwen3-MoE, 384
# tokens, ours, 4 rounds of 20 (traced builds); then the same for DeepSeek-V3 at 128 tokens (the one-kernel
# dispatch, which stalled 2 of 60 in call 4); then dispatches alone against dispatch + combine (untraced).
# Prediction: in a slow replay one call takes the whole stall (tens of ms), not every call 2.4 ms; in it one rank's
# programs reach a stage (a barrier or a Lamport poll of the combine) milliseconds after the others'. Dispatches
# alone stall too (the routed dispatch's barrier is where the traced FP8 call waited). NVLink's error counters
# (replays, recoveries) before and after: in call 2's traced FP8 call rank 3 passed its barrier within 25 µs
# of its start while rank 0 passed the same slots 0.9-2.5 ms after its own, spread over 1.5 ms, as if rank 3's
# flag stores reached rank 0 milliseconds late; a link's recovery would do that. Prediction: counters unchanged.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi nvlink -e > "$OUT/nvlink-errors-before.txt" 2>&1
S=benchmarks/experiments/moe_stalls.py
timeout 200 python3 $S --world 4 --shape qwen3-moe --tokens 384 --rounds 4 --cases ours --trace \
  --json "$OUT/stamps-q384.json" 2>&1 | tail -8
timeout 150 python3 $S --world 4 --shape deepseek-v3 --tokens 128 --rounds 4 --cases ours --trace \
  --json "$OUT/stamps-ds128.json" 2>&1 | tail -8
timeout 150 python3 $S --world 4 --shape qwen3-moe --tokens 384 --rounds 4 --cases ours+dispatch,ours \
  --json "$OUT/alone-q384.json" 2>&1 | tail -3
nvidia-smi nvlink -e > "$OUT/nvlink-errors-after.txt" 2>&1
echo "NVLink error counters that changed:"; diff "$OUT/nvlink-errors-before.txt" "$OUT/nvlink-errors-after.txt" | head -20
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
