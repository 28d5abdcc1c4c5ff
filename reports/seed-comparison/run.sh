#!/usr/bin/env bash
# The seed comparison (issue 47): the shipped MTP head against an independent draft model of its
# trainable size (src/mtpspec/pretrained/smollm2-135m-instruct/draft_model, made by
# train-baseline.sh beside this file), both in mtpspec's own loop through the same verify pass,
# k0 beside them. Three runs on the built-in on-device set (24 prompts, 6 categories), one on 48
# evenly spread Spec-Bench prompts, and the draft model at k = 1 and 2 (mtp's k is 3). Each run is
# one process, methods interleaved prompt by prompt; run it with nothing else on the machine.
#   [O=reports/seed-comparison] bash reports/seed-comparison/run.sh
set -euo pipefail
O=${O:-reports/seed-comparison}
for r in 1 2 3; do
  mtpspec bench --methods k0,mtp,draft-model -n 64 --threads 2 --no-progress --out $O/builtin-run$r
done
mtpspec bench --methods k0,mtp,draft-model -n 64 --threads 2 --no-progress \
  --prompts ../shared/data/spec_bench/question.jsonl --limit 48 --out $O/specbench48
for k in 1 2; do
  mtpspec bench --methods k0,mtp,draft-model --draft-model-k $k -n 64 --threads 2 --no-progress --out $O/builtin-dm-k$k
done
python reports/seed-comparison/summarize.py $O
