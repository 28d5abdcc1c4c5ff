# The 10M point's data and training flags (sourced by run-10m.sh; needs T). The 14 sets of the 5M
# point whole (5.22M response tokens: they have not grown since 2026-12-04) plus the first 547 shards
# of v9-batch-seed12 (4.79M response tokens): 10.00M response tokens, 9.6M of them trained after the
# 4% hold-out. Counted from the shards on 2026-12-07. Same flags as the 5M point (sets-5m.sh).
source reports/training/data-curve/sets-5m.sh   # D, DATA (the 14 sets), FLAGS
V9_SHARDS=547
DATA="$DATA --data $D/v9-batch-seed12:$V9_SHARDS"
