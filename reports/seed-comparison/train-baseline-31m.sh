#!/usr/bin/env bash
# The second baseline size: a draft model that owns what the MTP head borrows from the
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
D=datasets/smollm2-135m-instruct
DATA=""
for s in v3-seed0 v3-seed1 v3-seed2 v4-docs-seed0 v4-docs-seed1 v5-seed3 v5-seed4 v5-seed5 v5-seed6-fp32 \
  v6-seed7-fp32 v6-seed8-fp32 v7-everyday-seed9-fp32 v8-seed10 v8-seed11; do
  n=$(ls $D/$s | grep -c '^shard_'); DATA="$DATA --data $D/$s:$(( n < N ? n : N ))"
done
RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
OMP_NUM_THREADS=$T mtpspec train --kind draft-model $DATA --out $R --draft-model-init target \
  --draft-model-hidden 576 --draft-model-layers 1 --epochs $EPOCHS --min-steps 0 --lr $LR --warmup-steps 20 \
  --batch-size 16 --eval-every 25 --save-every 10 --holdout 0.04 --threads $T $RESUME
