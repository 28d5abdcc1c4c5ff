#!/bin/bash
# The data curve's 10M point (issue 52, item 3): one head from scratch, one epoch over 10.00M response
# tokens (sets-10m.sh), the 5M point's flags, then decoded as the curve's other points.
# Resumable: stop it at any time (kill, Ctrl-C) and run it again (the cache resumes at its first
# missing shard, training from $R/checkpoint.pt, written every 10 steps). Cost on 2 cores: the
# target's forwards over ~18.5M tokens at ~900 a second (~6 h; 2026-12-07, a Zen 4 EPYC) to fill a
# ~37 GB cache, then 3,829 steps (~2 h at the 5M point's 1.6-1.9 s a step).
# ONLINE=1: no cache (`mtpspec train --online`): the same forwards inside the training loop, so only
# $R/checkpoint.pt (40 MB) has to survive between sessions, at the same total cost for one epoch
# (held-out acceptance then only at the end: online, each evaluation runs the target again). Seen
# online on 2026-12-07: 25-30 s a step beside a data writer on the same 2 cores (not timed alone).
# ONLINE=1 after a cached start reads the samples $R/activations* already hold and computes only the rest
# (`--online` reads what a cache holds, 6e1eba1).
# Usage: [ONLINE=1] [THREADS=2] [R=runs/all10-e1] bash reports/training/data-curve/run-10m.sh
set -e
T=${THREADS:-2}; R=${R:-runs/all10-e1}; O=${O:-reports/training/data-curve/run-10m}
source reports/training/data-curve/sets-10m.sh   # D, DATA, FLAGS
RESUME=""; [ -f $R/checkpoint.pt ] && RESUME="--resume"
EXTRA=""; EVAL=${EVAL_EVERY:-400}
# online, each held-out evaluation runs the target over the 4% held out again (~14 min): only at the end
[ "${ONLINE:-0}" = 1 ] && EXTRA="--online" && EVAL=${EVAL_EVERY:-100000}
[ -f $R/head/mtp_head.safetensors ] || mtpspec train $DATA --out $R --draft-vocab-size 8192 --lr 2e-3 --eval-every $EVAL \
  $FLAGS $EXTRA $RESUME
mkdir -p $O && cp $R/metrics.jsonl $O/
source reports/training/data-curve/decode.sh
keep_head $R $O
decode_sets $R/head $O stepend
[ "${ONLINE:-0}" = 1 ] || python reports/training/data-curve/plot.py count $R $O   # seen.json: needs the cache
