# The curve's decoding protocol (and keep_head), shared by run-5m.sh, run-10m.sh,
# run-20m.sh and run-more.sh (sourced):
# decode_sets HEAD OUT PREFIX writes OUT/PREFIX-{builtin,people,specbench}.json (greedy, 64 new
# tokens): the built-in 24 at k = 4, people 48 at k = 4, Spec-Bench's first 48 at k = 6. Needs T.
decode_sets() {
  local A="mtpspec acceptance --head $1 -n 64 --threads $T"
  $A -k 4 --out $2/$3-builtin.json
  $A --prompts reports/training/everyday/ondevice-people-48.jsonl -k 4 --out $2/$3-people.json
  $A --prompts ../shared/data/spec_bench/question.jsonl --limit 48 -k 6 --out $2/$3-specbench.json
}
# keep_head RUN OUT copies RUN/head (the epoch's head, ~13 MB) to OUT/head, committed with the
# report: runs/ does not survive a new machine, and a later epoch (run-more.sh) starts from it.
keep_head() { mkdir -p $2/head && cp $1/head/mtp_head.json $1/head/mtp_head.safetensors $2/head/; }
