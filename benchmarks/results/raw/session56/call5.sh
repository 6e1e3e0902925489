#!/usr/bin/env bash
# Session 56, call 5, on nvidia-h200 (one GPU; two ranks share it: correctness only). Every MoE and registered-output
# GPU test at world 2 after session 55's changes (the chunked combine, heap_bytes_bound, _device_facts, the
# all-to-all). Call 2 ran the first 61 of them (3 skipped, none failed) before its time ran out.
# Prediction: all pass.
set -uo pipefail
source scripts/gpu_env.sh
TEST_TIMEOUT=540 TAIL=15 MAXFAIL=4 bash scripts/gpu_shared.sh tests/collectives/test_moe.py tests/channels/test_registered.py
