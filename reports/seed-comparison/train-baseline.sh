#!/usr/bin/env bash
# The ~3.3M-parameter draft-model baseline of this report: `mtpspec train --kind draft-model`
# (a 2-layer Llama, hidden 64, its own tied 49,152 x 64 embedding) on the first shard of each of
# the 14 kept sets (what one background thread could cache in this session's time box), the target's top-32 distributions as the teacher, the
# shipped head's optimizer settings (AdamW, lr 2e-3, 20 warm-up steps, cosine, batch 16, 4%
# held out, bf16 autocast where the CPU has native bf16), two epochs over the cache (the shipped
# head had four over 18x the data; two are what fitted the time box: ~6 s a step on one thread). Resumable: run it again and the cache continues at its first missing shard,
# the training from its checkpoint.
# N=4 EPOCHS=1: the first four shards of each set (all of a set's shards where it has fewer), once.
#   [R=runs/dm-3m] [T=1] [N=1] [EPOCHS=2] bash reports/seed-comparison/train-baseline.sh
set -euo pipefail
R=${R:-runs/dm-3m}; T=${T:-1}; N=${N:-1}; EPOCHS=${EPOCHS:-2}
. "$(dirname "$0")/data.sh"  # DATA: the 14 kept sets, N shards each
RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
OMP_NUM_THREADS=$T mtpspec train --kind draft-model $DATA --out $R --draft-model-hidden 64 --draft-model-layers 2 \
  --epochs $EPOCHS --min-steps 0 --lr 2e-3 --warmup-steps 20 --batch-size 16 --eval-every 50 --save-every 10 --holdout 0.04 \
  --threads $T $RESUME
