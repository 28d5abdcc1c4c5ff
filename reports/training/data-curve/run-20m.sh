#!/bin/bash
# The data curve's 20M point (issue 52, item 3): one head from scratch, one epoch over 20.00M response
# tokens (sets-20m.sh), the other points' flags, then decoded as they were.
# Online (`mtpspec train --online`): a 20M cache would be ~75 GB, so the target's forwards run in the
# training loop; CACHE_FROM=runs/all10-e1 reads every sample a 10M cache there holds instead.
# Cost on this project's 2-core CPUs: 7,643 steps over ~37M tokens of forwards, ~10 s a step online
# (2026-12-08, a Zen 4 EPYC, 2 threads, nothing else running), ~21 h: many sessions, and only
# $R/checkpoint.pt (40 MB) carries a part-trained run over; on a new machine it starts again. The
# finished head is kept in $O/head.
# Usage: [THREADS=2] [CACHE_FROM=runs/all10-e1] bash reports/training/data-curve/run-20m.sh
set -e
T=${THREADS:-2}; R=${R:-runs/all20-e1}; O=${O:-reports/training/data-curve/run-20m}
source reports/training/data-curve/sets-20m.sh   # D, DATA, FLAGS
source reports/training/data-curve/decode.sh     # decode_sets, keep_head
RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
EXTRA="--online --eval-every ${EVAL_EVERY:-100000}"; [ -n "$CACHE_FROM" ] && EXTRA="$EXTRA --cache-from $CACHE_FROM"
[ -f $R/head/mtp_head.safetensors ] || mtpspec train $DATA --out $R --draft-vocab-size 8192 --lr 2e-3 $EXTRA \
  $FLAGS $RESUME
mkdir -p $O && cp $R/metrics.jsonl $O/
keep_head $R $O
decode_sets $R/head $O stepend
