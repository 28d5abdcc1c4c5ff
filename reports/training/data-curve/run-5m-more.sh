#!/bin/bash
# Further epochs of the 5M point (run-5m.sh): epoch E (2, 3, ...) from the head of epoch E-1 over the
# same cache (symlinked from runs/all5-e1), at half the learning rate, as the shipped head's RECIPE.md
# steps 6-7 did for 3.62M tokens; then decoded as the curve's other points. Resumable like run-5m.sh.
# Usage: bash reports/training/data-curve/run-5m-more.sh E [THREADS=2]     # e.g. 2; ~1 h per epoch on 2 threads
set -e
E=${1:?usage: run-5m-more.sh EPOCH (2 or more)}; T=${THREADS:-2}
[ "$E" -ge 2 ] || { echo "EPOCH must be 2 or more (epoch 1 is run-5m.sh)"; exit 2; }
P=runs/all5-e$((E-1)); R=runs/all5-e$E; O=reports/training/data-curve/run-5m-e$E
[ -f $P/head/mtp_head.safetensors ] || { echo "$P/head is missing: run epoch $((E-1)) first"; exit 2; }
source reports/training/data-curve/sets-5m.sh   # D, DATA, FLAGS
mkdir -p $R && (cd $R && for a in ../all5-e1/activations*; do [ -e $(basename $a) ] || ln -s $a .; done)
RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
[ -f $R/head/mtp_head.safetensors ] || mtpspec train $DATA --out $R --init-head $P/head --lr 1e-3 --eval-every 400 $FLAGS $RESUME
mkdir -p $O && cp $R/metrics.jsonl $O/
A="mtpspec acceptance --head $R/head -n 64 --threads $T"
$A -k 4 --out $O/end-builtin.json
$A --prompts reports/training/everyday/ondevice-people-48.jsonl -k 4 --out $O/end-people.json
$A --prompts ../shared/data/spec_bench/question.jsonl --limit 48 -k 6 --out $O/end-specbench.json
