#!/bin/bash
# The third arm: fused features (3, 15, last) whose fuse layer starts as the last layer alone
# (MTPHead._init_weights since this commit), over run.sh's data and cache, alone on 2 threads.
set -e
F=runs/fz10; O=reports/training/fused-features; R=$F/fused-id
SETS="v3-seed0 v3-seed1 v3-seed2 v4-docs-seed0 v4-docs-seed1 v5-seed3 v5-seed4 v5-seed5 v5-seed6-fp32 v6-seed7-fp32 v6-seed8-fp32 v7-everyday-seed9-fp32"
DATA=""; for s in $SETS; do DATA="$DATA --data $F/data/$s"; done
mkdir -p $R && (cd $R && for a in ../fused/activations*; do [ -e $(basename $a) ] || ln -s $a .; done)  # the same view's cache
RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
[ -f $R/head/mtp_head.safetensors ] || mtpspec train $DATA --out $R --hidden-layers 3,15,-1 --draft-vocab-size 8192 \
  --max-draft-tokens 2 --epochs 1 --lr 2e-3 --warmup-steps 20 --batch-size 16 --eval-every 100 --save-every 10 \
  --holdout 0.04 --step-decay 0.5 --round-weight 2.0 --feature-weight 0 --threads 2 $RESUME > $F/fused-id.log 2>&1
A="mtpspec acceptance --head $R/head -n 64 --threads 2"
[ -f $O/fused-id-builtin.json ] || $A -k 4 --out $O/fused-id-builtin.json
[ -f $O/fused-id-people.json ] || $A --prompts reports/training/everyday/ondevice-people-48.jsonl -k 4 --out $O/fused-id-people.json
[ -f $O/fused-id-specbench.json ] || $A --prompts ../shared/data/spec_bench/question.jsonl --limit 48 -k 6 --out $O/fused-id-specbench.json
cp $R/metrics.jsonl $O/fused-id-metrics.jsonl
