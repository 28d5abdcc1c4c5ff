#!/bin/bash
# Decode a head on the sets heads are ranked on (greedy, bf16, 64 new tokens): the built-in set at
# k = 4 and at k = 3 (bf16's recommended k), the independent people-48 set at k = 4 and 48 evenly
# spread Spec-Bench prompts at k = 6. Writes end-builtin.json, end-builtin-k3.json, end-people.json
# and end-specbench.json into OUT. Usage: bash reports/heads/decode-sets.sh HEAD_DIR OUT [THREADS=2]
set -e
H=${1:?usage: decode-sets.sh HEAD_DIR OUT [THREADS]}; O=${2:?usage: decode-sets.sh HEAD_DIR OUT [THREADS]}
mkdir -p "$O"
A="mtpspec acceptance --head $H -n 64 --threads ${3:-2}"
$A -k 4 --out "$O/end-builtin.json"
$A -k 3 --out "$O/end-builtin-k3.json"
$A --prompts reports/training/everyday/ondevice-people-48.jsonl -k 4 --out "$O/end-people.json"
$A --prompts ../shared/data/spec_bench/question.jsonl --limit 48 -k 6 --out "$O/end-specbench.json"
