# The 5M point's data and training flags, shared by run-5m.sh and run-more.sh 5m (sourced; needs T).
# All 14 kept sets whole (33,398 samples, 5.22M response tokens as of 2026-12-04) and the shipped
# head's epoch-1 flags (src/mtpspec/pretrained/smollm2-135m-instruct/RECIPE.md).
D=datasets/smollm2-135m-instruct
DATA=""; for s in v3-seed0 v3-seed1 v3-seed2 v4-docs-seed0 v4-docs-seed1 v5-seed3 v5-seed4 \
  v5-seed5 v5-seed6-fp32 v6-seed7-fp32 v6-seed8-fp32 v7-everyday-seed9-fp32 v8-seed10 v8-seed11; do
  DATA="$DATA --data $D/$s"; done
FLAGS="--max-draft-tokens 2 --epochs 1 --warmup-steps 20 --batch-size 16 --save-every 10 --holdout 0.04 \
  --step-decay 0.5 --round-weight 2.0 --feature-weight 0 --threads $T"
