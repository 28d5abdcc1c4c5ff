# The 20M point's data and training flags (sourced by run-20m.sh and run-more.sh 20m; needs T). All
# kept data of 2026-12-08: the 14 sets of the 5M point whole (5.22M response tokens), v9-batch-seed12
# whole (997 shards, 8.72M) and the first 698 shards of v10-batch-seed13 (6.07M): 20,001,969
# response tokens, 36.98M tokens in all (prompts included), counted from the manifests and shards on
# 2026-12-08. Same flags as the 5M and 10M points (sets-5m.sh).
source reports/training/data-curve/sets-5m.sh   # D, DATA (the 14 sets), FLAGS
V10_SHARDS=698
DATA="$DATA --data $D/v9-batch-seed12:997 --data $D/v10-batch-seed13:$V10_SHARDS"
