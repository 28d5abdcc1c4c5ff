#!/usr/bin/env bash
# Greedy acceptance of saved heads on the built-in on-device set (k = 2, 4, 6) and on 48
# evenly spread Spec-Bench prompts (k = 6), 64 new tokens, written next to this script.
#   [OUT=DIR] bash reports/heads/head-v8/eval.sh NAME=HEAD_DIR [NAME=HEAD_DIR ...]
set -euo pipefail
OUT=${OUT:-reports/head-v8}  # where the JSON goes
for pair in "$@"; do
  name=${pair%%=*}; head=${pair#*=}
  mtpspec acceptance --head "$head" -k 2,4,6 -n 64 --threads 2 --out $OUT/acc-builtin-$name.json
  mtpspec acceptance --head "$head" --prompts ../shared/data/spec_bench/question.jsonl --limit 48 -k 6 -n 64 \
    --threads 2 --out $OUT/acc-specbench-$name.json
done
