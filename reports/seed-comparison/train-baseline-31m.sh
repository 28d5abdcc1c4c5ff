#!/usr/bin/env bash
# The issue's second baseline size: a draft model that owns what the MTP head borrows from the
# target, its embedding / LM head (49,152 x 576, tied: 28.3M), plus one decoder layer of the
# target's width (3.5M): 31.9M parameters. It starts as a copy of the target's embedding, first
# layer and final norm (`--draft-model-init target`), then is distilled exactly as the 3.3M
# baseline (train-baseline.sh): the first N shards of each of the 14 kept sets (all of a set's
# shards where it has fewer; N=1: train-baseline.sh's data), the target's top-32 distributions as
# the teacher, AdamW with warm-up and cosine decay, batch 16, 4% held out, bf16 autocast where the
# CPU has native bf16. Resumable: run it again and it continues.
#   [R=runs/dm-31m] [T=1] [LR=2e-3] [EPOCHS=2] [N=1] bash reports/seed-comparison/train-baseline-31m.sh
set -euo pipefail
R=${R:-runs/dm-31m}; T=${T:-1}; LR=${LR:-2e-3}; EPOCHS=${EPOCHS:-2}; N=${N:-1}
. "$(dirname "$0")/data.sh"  # DATA: the 14 kept sets, N shards each
RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
OMP_NUM_THREADS=$T mtpspec train --kind draft-model $DATA --out $R --draft-model-init target \
  --draft-model-hidden 576 --draft-model-layers 1 --epochs $EPOCHS --min-steps 0 --lr $LR --warmup-steps 20 \
  --batch-size 16 --eval-every 25 --save-every 10 --holdout 0.04 --threads $T $RESUME
