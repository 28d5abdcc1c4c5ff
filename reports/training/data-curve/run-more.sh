#!/bin/bash
# Further epochs of a curve point (run-5m.sh, run-10m.sh): epoch E (2, 3, ...) from the head of
# epoch E-1 over the same cache (symlinked from runs/allN-e1), at half the learning rate, as the
# shipped head's RECIPE.md steps 6-7 did for 3.62M tokens; then decoded as the curve's other points.
# Resumable like the first epoch: rerun the same command (training resumes from $R/checkpoint.pt).
# Usage: [THREADS=2] bash reports/training/data-curve/run-more.sh POINT E   # POINT 5m or 10m; e.g. 10m 2
#   5m: ~1 h an epoch on 2 threads (2,003 steps); 10m: ~2 h (3,829 steps; its cache is 37 GB)
set -e
PT=${1:?usage: run-more.sh POINT EPOCH   (POINT: 5m or 10m; EPOCH: 2 or more)}
E=${2:?usage: run-more.sh POINT EPOCH   (POINT: 5m or 10m; EPOCH: 2 or more)}; T=${THREADS:-2}
S=reports/training/data-curve/sets-$PT.sh
[ -f $S ] || { echo "no $S: POINT is 5m or 10m"; exit 2; }
[ "$E" -ge 2 ] || { echo "EPOCH must be 2 or more (epoch 1 is run-$PT.sh)"; exit 2; }
N=all${PT%m}; P=runs/$N-e$((E-1)); R=runs/$N-e$E; O=reports/training/data-curve/run-$PT-e$E
[ -f $P/head/mtp_head.safetensors ] || { echo "$P/head is missing: run epoch $((E-1)) first"; exit 2; }
source $S   # D, DATA, FLAGS
mkdir -p $R && (cd $R && for a in ../$N-e1/activations*; do [ -e $(basename $a) ] || ln -s $a .; done)
RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
[ -f $R/head/mtp_head.safetensors ] || mtpspec train $DATA --out $R --init-head $P/head --lr 1e-3 --eval-every 400 $FLAGS $RESUME
mkdir -p $O && cp $R/metrics.jsonl $O/
source reports/training/data-curve/decode.sh
decode_sets $R/head $O end
