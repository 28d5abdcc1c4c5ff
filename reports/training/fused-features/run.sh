#!/bin/bash
# EAGLE-3-style fused features (target layers 3, 15 and the last) against the last layer alone, at
# 10x the data of reports/training/ablations-v3.md's run B: two heads from scratch, one epoch each over a frozen
# copy of the first 10% of the 12 sets the data curve uses (0.51M response tokens), the data curve's
# flags without the feature loss, run side by side on one thread each; decoded on the built-in set,
# people 48 (k = 4) and Spec-Bench 48 (k = 6). Resumable.   Usage: bash reports/training/fused-features/run.sh
set -e
D=datasets/smollm2-135m-instruct; F=runs/fz10; O=reports/training/fused-features
SETS="v3-seed0 v3-seed1 v3-seed2 v4-docs-seed0 v4-docs-seed1 v5-seed3 v5-seed4 v5-seed5 v5-seed6-fp32 v6-seed7-fp32 v6-seed8-fp32 v7-everyday-seed9-fp32"
[ -d $F/data ] || python reports/training/data-curve/freeze.py 0.10 $F/data $(for s in $SETS; do echo $D/$s; done)
DATA=""; for s in $SETS; do DATA="$DATA --data $F/data/$s"; done
ARGS="--draft-vocab-size 8192 --max-draft-tokens 2 --epochs 1 --lr 2e-3 --warmup-steps 20 --batch-size 16 --eval-every 100 \
  --save-every 10 --holdout 0.04 --step-decay 0.5 --round-weight 2.0 --feature-weight 0 --threads 1"
train() {  # NAME HIDDEN_LAYERS
  R=$F/$1; RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
  [ -f $R/head/mtp_head.safetensors ] || OMP_NUM_THREADS=1 mtpspec train $DATA --out $R --hidden-layers $2 $ARGS $RESUME > $F/$1.log 2>&1
}
train last -1 & train fused 3,15,-1 & wait
for n in last fused; do
  A="mtpspec acceptance --head $F/$n/head -n 64 --threads 2"
  [ -f $O/$n-builtin.json ] || $A -k 4 --out $O/$n-builtin.json
  [ -f $O/$n-people.json ] || $A --prompts reports/training/everyday/ondevice-people-48.jsonl -k 4 --out $O/$n-people.json
  [ -f $O/$n-specbench.json ] || $A --prompts ../shared/data/spec_bench/question.jsonl --limit 48 -k 6 --out $O/$n-specbench.json
  cp $F/$n/metrics.jsonl $O/$n-metrics.jsonl
done
