#!/usr/bin/env bash
# Greedy acceptance (fp32 on this EPYC, 64 new tokens) of saved heads on four prompt sets:
# the built-in on-device set (k = 2, 4, 6), the 48 on-device prompts written for this report
# by someone who never saw the templates (k = 4, 6), 48 evenly spread Spec-Bench prompts
# (k = 6), and 48 prompts of v3-seed2, a data set no head here trained on (k = 6).
#   [OUT=DIR] bash reports/training/everyday/eval.sh NAME=HEAD_DIR [NAME=HEAD_DIR ...]
set -euo pipefail
OUT=${OUT:-reports/everyday}
THREADS=${THREADS:-2}
D=datasets/smollm2-135m-instruct
for pair in "$@"; do
  name=${pair%%=*}; head=${pair#*=}
  acc() { mtpspec acceptance --head "$head" -n 64 --threads "$THREADS" "$@"; }
  acc -k 2,4,6 --out $OUT/acc-builtin-$name.json
  acc --prompts reports/training/everyday/ondevice-people-48.jsonl -k 4,6 --out $OUT/acc-people-$name.json
  acc --prompts ../shared/data/spec_bench/question.jsonl --limit 48 -k 6 --out $OUT/acc-specbench-$name.json
  acc --prompts $D/v3-seed2 --limit 48 -k 6 --out $OUT/acc-v3seed2-$name.json
done
