#!/bin/bash
# The shipped head (v11: 1 block, 4 epochs over the 5M point) grown to 2 blocks (grow.py), then one
# epoch over the 5M cache with exactly the flags of the 1-block fifth epoch (run-5m-more.sh 5), so
# runs/all5-e5 is the equal-budget control. Resumable; decoded as the data curve's points.
# Usage: bash reports/heads/copy-and-grow/run-grow-5m.sh      # ~1 h on 2 threads; needs runs/all5-e1's cache
set -e
T=${THREADS:-2}; R=runs/grow11; O=reports/heads/copy-and-grow/grow-5m
source reports/training/data-curve/sets-5m.sh   # D, DATA, FLAGS
[ -f $R/init-head/mtp_head.safetensors ] || python reports/heads/copy-and-grow/grow.py src/mtpspec/pretrained/smollm2-135m-instruct $R/init-head
mkdir -p $R && (cd $R && for a in ../all5-e1/activations*; do [ -e $(basename $a) ] || ln -s $a .; done)
RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
[ -f $R/head/mtp_head.safetensors ] || mtpspec train $DATA --out $R --init-head $R/init-head --lr 1e-3 --eval-every 400 $FLAGS $RESUME
mkdir -p $O && cp $R/metrics.jsonl $O/
bash reports/heads/decode-sets.sh $R/head $O $T
