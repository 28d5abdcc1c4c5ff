#!/usr/bin/env bash
# Held-out and decoded acceptance vs data size: one from-scratch head, one epoch over a frozen
# copy of the first FRACTION of every kept set (each sample seen once, shuffled across sets),
# stopped at 50, 100, 200, 400 steps of 16 samples (~2,500 response tokens each) and at the
# epoch's end ("end"); at each stop the head is exported and decoded on the built-in set and on
# the independent on-device set (reports/training/everyday/ondevice-people-48.jsonl), k = 4.
# Resumable: rerun it and it continues from the last stop done. At the end it copies the metrics and
# the acceptance files into O (default reports/training/data-curve/run) and counts the tokens seen (seen.json),
# which is all that plot.py reads.
#   [FRACTION=0.35] [R=runs/data-curve] [O=reports/training/data-curve/run] [EXTRA=...] bash reports/training/data-curve/run.sh THREADS [STOPS...]
# A second run on the same data reuses the first one's cache: link its data/ and activations*/ into R.
set -euo pipefail
T=${1:-1}; shift || true
STOPS=${*:-50 100 200 400 end}
D=datasets/smollm2-135m-instruct
R=${R:-runs/data-curve}  # give each EXTRA (more `mtpspec train` flags, e.g. --feature-weight 0) a run of its own
SETS=${SETS:-"v3-seed0 v3-seed1 v3-seed2 v4-docs-seed0 v4-docs-seed1 v5-seed3 v5-seed4 v5-seed5 v5-seed6-fp32 v6-seed7-fp32 v6-seed8-fp32 v7-everyday-seed9-fp32"}  # SETS="..." to train on others
if [ ! -d $R/data ]; then  # a frozen copy of the first FRACTION of every kept set's shards
  python reports/training/data-curve/freeze.py ${FRACTION:-0.35} $R/data $(for s in $SETS; do echo $D/$s; done)
fi
DATA=""; for s in $SETS; do DATA="$DATA --data $R/data/$s"; done
for S in $STOPS; do
  [ -f $R/heads/step$S/acceptance-people.json ] && continue
  if [ ! -f $R/heads/step$S/mtp_head.json ]; then
    RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
    MAX=""; [ "$S" != end ] && MAX="--max-steps $S"
    OMP_NUM_THREADS=$T mtpspec train $DATA --out $R --draft-vocab-size 8192 --max-draft-tokens 2 --epochs 1 \
      --lr 2e-3 --warmup-steps 20 --batch-size 16 --eval-every 50 --save-every 10 --holdout 0.04 --step-decay 0.5 \
      --round-weight 2.0 --threads $T $MAX $RESUME ${EXTRA:-}
    python reports/training/data-curve/export.py $R $R/heads/step$S 8192 6
  fi
  mtpspec acceptance --head $R/heads/step$S -k 4 -n 64 --threads $T --out $R/heads/step$S/acceptance-builtin.json
  mtpspec acceptance --head $R/heads/step$S --prompts reports/training/everyday/ondevice-people-48.jsonl -k 4 -n 64 \
    --threads $T --out $R/heads/step$S/acceptance-people.json
done
O=${O:-reports/data-curve/run}; mkdir -p $O && cp $R/metrics.jsonl $O/
for S in $STOPS; do for n in builtin people; do cp $R/heads/step$S/acceptance-$n.json $O/step$S-$n.json; done; done
python reports/training/data-curve/plot.py count $R $O
