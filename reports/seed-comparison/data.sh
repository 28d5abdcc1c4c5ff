#!/usr/bin/env bash
# Sourced by the seed comparison's training scripts: DATA, the `--data` flags of the 14 kept sets,
# the first N shards of each (all of a set's shards where it has fewer).
D=datasets/smollm2-135m-instruct
DATA=""
for s in v3-seed0 v3-seed1 v3-seed2 v4-docs-seed0 v4-docs-seed1 v5-seed3 v5-seed4 v5-seed5 v5-seed6-fp32 \
  v6-seed7-fp32 v6-seed8-fp32 v7-everyday-seed9-fp32 v8-seed10 v8-seed11; do
  n=$(ls $D/$s | grep -c '^shard_'); DATA="$DATA --data $D/$s:$(( n < N ? n : N ))"
done
