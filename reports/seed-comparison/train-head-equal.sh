#!/usr/bin/env bash
# The MTP head at a baseline's budget: from scratch, on the same shards, epochs and teacher as a
# draft-model run of train-baseline.sh (N, EPOCHS), with the shipped head's own flags (RECIPE.md
# step 8: draft vocabulary 8,192, two unrolled steps, lr 2e-3, step decay 0.5, round weight 2,
# no feature loss, batch 16, 4% held out). It reads the activations that baseline's run cached
# (CACHE: its run folder; the cache holds the head's features as well), so the two saw the very
# same samples in the same split; without CACHE it caches them itself. Resumable.
#   [R=runs/head-4sh] [CACHE=runs/dm-3m-4sh] [T=1] [N=4] [EPOCHS=1] bash reports/seed-comparison/train-head-equal.sh
set -euo pipefail
R=${R:-runs/head-4sh}; T=${T:-1}; N=${N:-4}; EPOCHS=${EPOCHS:-1}; CACHE=${CACHE:-}
. "$(dirname "$0")/data.sh"  # DATA: the 14 kept sets, N shards each
mkdir -p $R
if [ -n "$CACHE" ]; then for a in "$(cd $CACHE && pwd)"/activations*; do ln -sfn $a $R/; done; fi
RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
OMP_NUM_THREADS=$T mtpspec train $DATA --out $R --draft-vocab-size 8192 --max-draft-tokens 2 --epochs $EPOCHS \
  --min-steps 0 --lr 2e-3 --warmup-steps 20 --batch-size 16 --eval-every 200 --save-every 10 --holdout 0.04 \
  --step-decay 0.5 --round-weight 2.0 --feature-weight 0 --threads $T $RESUME
