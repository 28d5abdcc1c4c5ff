#!/bin/bash
# Tokens per target forward of the shipped head's trees vs its chains (greedy, bf16, 64 new tokens, no timing).
# THREADS=1 by default, so that it may run beside another job; OUT=the folder for the JSON files.
set -e
T=${THREADS:-1}; O=${OUT:-reports/tree-acceptance}; SB=../shared/data/spec_bench/question.jsonl
A="mtpspec acceptance -n 64 --threads $T"
$A -k 2,4,6 --out $O/builtin-chain.json
$A --tree --tree-shape cost -k 8 --out $O/builtin-tree-cost.json
$A --tree --tree-shape fixed -k 8,15 --out $O/builtin-tree-fixed.json
$A --prompts $SB --limit 48 -k 6 --out $O/spec-chain.json
$A --prompts $SB --limit 48 --tree --tree-shape cost -k 8 --out $O/spec-tree-cost.json
$A --prompts $SB --limit 48 --tree --tree-shape fixed -k 8,15 --out $O/spec-tree-fixed.json
