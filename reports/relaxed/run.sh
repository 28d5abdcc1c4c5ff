#!/bin/bash
# Relaxed acceptance against exact, side by side in one bench run per prompt set: k0 (plain decoding,
# the reference output), mtp (the shipped head, exact) and mtp-relaxed under each rule over a sweep of
# its parameter; every output scored (the target's log-probability, edit distance to k0, Spec-Bench's
# references). Greedy, the head's k, bf16 on the embedded GGUF's blocks, 64 new tokens, timed: run it
# with nothing else on the machine. OUT=the folder for the two bench reports.
set -e
O=${OUT:-reports/relaxed}; SB=../shared/data/spec_bench/question.jsonl
RULES="typical:0.4;typical:0.2;typical:0.09;topm:3,0.9;topm:3,0.6;topm:3,0.3;entropy:4;entropy:3;entropy:2"
B="mtpspec bench --methods k0,mtp,mtp-relaxed --acceptance $RULES -n 64 --no-progress"
$B --out $O/builtin
$B --prompts $SB --limit 48 --out $O/specbench
python reports/relaxed/summarize.py $O/builtin $O/specbench --out $O
