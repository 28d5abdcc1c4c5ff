#!/bin/bash
# The data curve's 5M point (issue 11, item 5): one head from scratch, one epoch over ALL kept data
# (14 sets, 33,398 samples, 5.22M response tokens as of 2026-12-04), the recipe's epoch-1 flags
# (src/mtpspec/pretrained/smollm2-135m-instruct/RECIPE.md), then decoded as the curve's other points.
# Resumable: run it again after an interruption (the cache resumes at its first missing shard, the
# training from runs/all5-e1/checkpoint.pt). On the 2-core Xeon: ~3 h of caching from nothing, then ~50 min.
# Usage: bash reports/training/data-curve/run-5m.sh [THREADS=2]
set -e
T=${THREADS:-2}; R=runs/all5-e1; O=reports/training/data-curve/run-5m
source reports/training/data-curve/sets-5m.sh   # D, DATA, FLAGS
RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
[ -f $R/head/mtp_head.safetensors ] || mtpspec train $DATA --out $R --draft-vocab-size 8192 --lr 2e-3 --eval-every 200 $FLAGS $RESUME
mkdir -p $O && cp $R/metrics.jsonl $O/
source reports/training/data-curve/decode.sh
keep_head $R $O
decode_sets $R/head $O stepend
python reports/training/data-curve/plot.py count $R $O   # seen.json: the response tokens trained on at each point
