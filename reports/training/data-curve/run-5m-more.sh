#!/bin/bash
# Further epochs of the 5M point: run-more.sh 5m E (kept under this name: the reports and RECIPE.md
# cite it). Usage: bash reports/training/data-curve/run-5m-more.sh E [THREADS=2]   # ~1 h per epoch
exec bash "$(dirname "$0")/run-more.sh" 5m "$@"
