#!/bin/bash
# Wall time of 12 training steps of the ablation recipe on the snapshot's cache, 2 threads, with the
# mtpspec source tree SRC (e.g. a `git worktree add /tmp/old 782f19a` checkout's src, or src):
#   bash reports/training/train-rows/time.sh SRC OUT_DIR [K]
# Needs runs/abl/F2-base's activation caches (reports/training/feature-loss/ builds them). Run nothing else meanwhile.
set -e
src=$(realpath "$1"); out=$2; K=${3:-6}
rm -rf "$out"; mkdir -p "$out"
ln -s "$PWD/runs/abl/F2-base/activations" "$PWD/runs/abl/F2-base/activations-1" "$out/"
start=$(date +%s.%N)
PYTHONPATH=$src python -c "from mtpspec.cli import main; main()" train --data runs/abl/data/v3-seed0 \
  --data runs/abl/data/v3-seed1 --out "$out" --draft-vocab-size 8192 --max-draft-tokens "$K" --epochs 20 \
  --max-steps 12 --lr 2e-3 --warmup-steps 10 --batch-size 16 --eval-every 12 --save-every 12 --holdout 0.08 \
  --step-decay 0.5 --no-bf16 --threads 2 > "$out.log" 2>&1
echo "$src K=$K: $(echo "$(date +%s.%N) - $start" | bc) s in all"
tr '\r' '\n' < "$out.log" | grep -E " (1|11)/[0-9]+ \[" | grep -o "\[[0-9:]*<" | sort -u | tr '\n' ' '
echo "(elapsed at steps 1 and 11: their difference / 10 = s per step)"
