#!/bin/bash
# Further epochs of a curve point (run-5m.sh, run-10m.sh, run-20m.sh): epoch E (2, 3, ...) from the head of
# epoch E-1 over the same cache (symlinked from runs/allN-e1), at half the learning rate, as the
# shipped head's RECIPE.md steps 6-7 did for 3.62M tokens; then decoded as the curve's other points.
# Resumable like the first epoch: rerun the same command (training resumes from $R/checkpoint.pt).
# On a new machine (no runs/): it starts from the head epoch E-1 kept in its report folder
# (keep_head, decode.sh) and, with no cache to link, trains online (`mtpspec train --online`: the
# target's forwards inside the loop, ~4x a cached epoch's time at 10M; held-out only at the end).
# Usage: [THREADS=2] bash reports/training/data-curve/run-more.sh POINT E   # POINT 5m, 10m or 20m; e.g. 10m 2
#   5m: ~1 h an epoch on 2 threads (2,003 steps); 10m: ~2 h (3,829 steps; its cache is 37 GB)
set -e
PT=${1:?usage: run-more.sh POINT EPOCH   (POINT: 5m, 10m or 20m; EPOCH: 2 or more)}
E=${2:?usage: run-more.sh POINT EPOCH   (POINT: 5m, 10m or 20m; EPOCH: 2 or more)}; T=${THREADS:-2}
S=reports/training/data-curve/sets-$PT.sh
[ -f $S ] || { echo "no $S: POINT is 5m, 10m or 20m"; exit 2; }
[ "$E" -ge 2 ] || { echo "EPOCH must be 2 or more (epoch 1 is run-$PT.sh)"; exit 2; }
N=all${PT%m}; P=runs/$N-e$((E-1)); R=runs/$N-e$E; O=reports/training/data-curve/run-$PT-e$E
PO=reports/training/data-curve/run-$PT; [ "$E" -gt 2 ] && PO=$PO-e$((E-1))
H=$P/head; [ -f $H/mtp_head.safetensors ] || H=$PO/head
[ -f $H/mtp_head.safetensors ] || { echo "neither $P/head nor $PO/head: run epoch $((E-1)) first"; exit 2; }
source $S   # D, DATA, FLAGS
source reports/training/data-curve/decode.sh   # decode_sets, keep_head
mkdir -p $R; EXTRA="--eval-every 400"
if compgen -G "runs/$N-e1/activations*" > /dev/null; then
  (cd $R && for a in ../$N-e1/activations*; do [ -e $(basename $a) ] || ln -s $a .; done)
else EXTRA="--online --eval-every 100000"; echo "no cache in runs/$N-e1: training online"; fi
RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
[ -f $R/head/mtp_head.safetensors ] || mtpspec train $DATA --out $R --init-head $H --lr 1e-3 $EXTRA $FLAGS $RESUME
mkdir -p $O && cp $R/metrics.jsonl $O/
keep_head $R $O
decode_sets $R/head $O end
