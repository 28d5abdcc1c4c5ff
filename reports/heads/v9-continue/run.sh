#!/bin/bash
# The shipped head (RECIPE.md step 8: four epochs over 5.00M response tokens of the sets v3-v8)
# continued for one epoch on data it never saw: the first N shards of v9-batch-seed12, the first set
# written by the batched engine (issue 52). Half the learning rate of epoch 1, as epochs 2-4 ran;
# otherwise the recipe's flags. Then decoded on the three sets the curve ranks heads on.
# Resumable: run it again after a stop (the cache resumes at its first missing shard, the training
# from $R/checkpoint.pt). Usage: N=150 bash reports/heads/v9-continue/run.sh   [THREADS=2]
set -e
T=${THREADS:-2}; N=${N:-150}; R=runs/v9cont-$N; O=reports/heads/v9-continue/n$N
D=datasets/smollm2-135m-instruct
FLAGS="--max-draft-tokens 2 --epochs 1 --min-steps 0 --warmup-steps 20 --batch-size 16 --save-every 10 \
  --holdout 0.04 --step-decay 0.5 --round-weight 2.0 --feature-weight 0 --threads $T"
RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
[ -f $R/head/mtp_head.safetensors ] || mtpspec train --data $D/v9-batch-seed12:$N --out $R \
  --init-head src/mtpspec/pretrained/smollm2-135m-instruct --lr 1e-3 --eval-every 100 $FLAGS $RESUME
mkdir -p $O && cp $R/metrics.jsonl $O/
bash reports/heads/decode-sets.sh $R/head $O $T
