#!/bin/bash
# The data curve's 5M point (issue 11, item 5): one head from scratch, one epoch over ALL kept data
# (14 sets, 33,398 samples, 5.22M response tokens as of 2026-12-04), the recipe's epoch-1 flags
# (src/mtpspec/pretrained/smollm2-135m-instruct/RECIPE.md), then decoded as the curve's other points.
# Resumable: run it again after an interruption (the cache resumes at its first missing shard, the
# training from runs/all5-e1/checkpoint.pt). On the 2-core Xeon: ~2 h of caching, then ~50 min.
# Usage: bash reports/data-curve/run-5m.sh [THREADS=2]
set -e
T=${THREADS:-2}; R=runs/all5-e1; O=reports/data-curve/run-5m
D=datasets/smollm2-135m-instruct
DATA=""; for s in v3-seed0 v3-seed1 v3-seed2 v4-docs-seed0 v4-docs-seed1 v5-seed3 v5-seed4 \
  v5-seed5 v5-seed6-fp32 v6-seed7-fp32 v6-seed8-fp32 v7-everyday-seed9-fp32 v8-seed10 v8-seed11; do
  DATA="$DATA --data $D/$s"; done
FLAGS="--max-draft-tokens 2 --epochs 1 --warmup-steps 20 --batch-size 16 --save-every 10 --holdout 0.04 \
  --step-decay 0.5 --round-weight 2.0 --feature-weight 0 --threads $T"
RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
[ -f $R/head/mtp_head.safetensors ] || mtpspec train $DATA --out $R --draft-vocab-size 8192 --lr 2e-3 --eval-every 200 $FLAGS $RESUME
mkdir -p $O && cp $R/metrics.jsonl $O/
A="mtpspec acceptance --head $R/head -n 64 --threads $T"
$A -k 4 --out $O/stepend-builtin.json
$A --prompts reports/everyday/ondevice-people-48.jsonl -k 4 --out $O/stepend-people.json
$A --prompts ../shared/data/spec_bench/question.jsonl --limit 48 -k 6 --out $O/stepend-specbench.json
python reports/data-curve/plot.py count $R $O   # seen.json: the response tokens trained on at each point
