#!/usr/bin/env bash
# The seed comparison (issue 47): the shipped MTP head against an independent draft model, both
# in mtpspec's own loop through the same verify pass, k0 beside them. Three runs on the built-in
# on-device set (24 prompts, 6 categories), one on 48 evenly spread Spec-Bench prompts, and the
# draft model at k = 1 and 2 (mtp's k is 3). Each run is one process, methods interleaved prompt
# by prompt; run it with nothing else on the machine.
# DM: the draft model (default: the shipped 3.3M baseline, made by train-baseline.sh); TAG names
# its runs' folders (builtin-TAG-run1, specbench48-TAG, builtin-TAG-dm-k1; no TAG: builtin-run1,
# specbench48, builtin-dm-k1). The 31.9M baseline (train-baseline-31m.sh):
#   TAG=31m DM=runs/dm-31m/draft_model bash reports/seed-comparison/run.sh
# HEAD: another head than the shipped one (at equal budget: train-head-equal.sh); K: mtp's k
# (default: the head's recommended k; a head without one drafts 3).
#   [O=reports/seed-comparison] [DM=DIR] [HEAD=DIR] [K=k] [TAG=NAME] bash reports/seed-comparison/run.sh
set -euo pipefail
O=${O:-reports/seed-comparison}; T=${TAG:+$TAG-}
B="mtpspec bench --methods k0,mtp,draft-model -n 64 --threads 2 --no-progress ${DM:+--draft-model $DM} ${HEAD:+--head $HEAD} ${K:+-k $K}"
for r in 1 2 3; do
  $B --out $O/builtin-${T}run$r
done
$B --prompts ../shared/data/spec_bench/question.jsonl --limit 48 --out $O/specbench48${TAG:+-$TAG}
for k in 1 2; do
  $B --draft-model-k $k --out $O/builtin-${T}dm-k$k
done
python reports/seed-comparison/summarize.py $O
