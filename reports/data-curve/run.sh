#!/usr/bin/env bash
# Held-out and decoded acceptance vs data size: one from-scratch head, one epoch over all kept
# data (each sample seen once, shuffled across sets), stopped at 50, 100, 200, 400 steps of
# 16 samples (~2,500 response tokens each), its head exported and decoded on the built-in set
# at each stop. Resumable: rerun it and it continues from the last stop done.
#   [FRACTION=0.4] bash reports/data-curve/run.sh THREADS [STOPS...]
set -euo pipefail
T=${1:-1}; shift || true
STOPS=${*:-50 100 200 400}
D=datasets/smollm2-135m-instruct
R=runs/data-curve
DATA=""
for s in v3-seed0 v3-seed1 v3-seed2 v4-docs-seed0 v4-docs-seed1 v5-seed3 v5-seed4; do DATA="$DATA --data $R/data/$s"; done
if [ ! -d $R/data ]; then  # a frozen copy of the first FRACTION of every kept set's shards
  python reports/data-curve/freeze.py ${FRACTION:-0.4} $R/data $D/{v3-seed0,v3-seed1,v3-seed2,v4-docs-seed0,v4-docs-seed1,v5-seed3,v5-seed4}
fi
for S in $STOPS; do
  [ -f $R/heads/step$S/mtp_head.json ] && continue
  RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
  OMP_NUM_THREADS=$T mtpspec train $DATA --out $R --draft-vocab-size 8192 --max-draft-tokens 6 --epochs 1 \
    --lr 2e-3 --warmup-steps 20 --batch-size 16 --eval-every 50 --save-every 10 --holdout 0.04 --step-decay 0.5 \
    --round-weight 2.0 --threads $T --max-steps $S $RESUME
  python reports/data-curve/export.py $R $R/heads/step$S
  mtpspec acceptance --head $R/heads/step$S -k 4 -n 64 --threads $T --out $R/heads/step$S/acceptance-builtin.json
done
