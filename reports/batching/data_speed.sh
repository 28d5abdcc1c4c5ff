#!/usr/bin/env bash
# Response tokens per second of `mtpspec data`: Hugging Face's generate (--engine hf, the older
# sets' generator) against mtpspec's batched loop (--engine batch), one after the other on the
# same seeds and settings, on the embedded SmolLM2 (bf16, the machine's threads).
# Usage: bash reports/batching/data_speed.sh [OUT_DIR] [NUM_SAMPLES]   (defaults: /tmp/data-speed 64)
set -euo pipefail
out=${1:-/tmp/data-speed}
n=${2:-64}
rm -rf "$out" && mkdir -p "$out"
for engine in hf batch; do
    start=$(date +%s.%N)
    mtpspec data --out "$out/$engine" --num-samples "$n" --engine "$engine" --seed 1 > "$out/$engine.log" 2>&1
    end=$(date +%s.%N)
    python - "$out/$engine" "$start" "$end" "$engine" <<'PY'
import json, sys
m = json.load(open(f"{sys.argv[1]}/manifest.json"))
s = float(sys.argv[3]) - float(sys.argv[2])
print(f"{sys.argv[4]:5s}: {m['num_samples']} samples, {m['num_response_tokens']} response tokens in {s:.0f} s "
      f"= {m['num_response_tokens'] / s:.1f} response tokens/s (load included)")
PY
done
