#!/bin/bash
# The trainer on a CUDA GPU (issue 52, item 5): its CUDA tests, for a session lent a GPU. From the
# repository root, through the `device` tool, nothing to carry (the device image holds torch,
# transformers, accelerate, safetensors, tqdm, typer and pytest; mtpspec runs from src/):
#   run(command="bash reports/training/gpu/check.sh", timeout_s=420)
# Here (no GPU) the same command runs the CPU half and skips the CUDA tests with the reason.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
LOG=${OUT:-/tmp}/gpu-check.log
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import torch, transformers; print('torch', torch.__version__, '| cuda', torch.cuda.is_available(), \
'| transformers', transformers.__version__)"
  python3 -m pytest -p no:cacheprovider -rs -v tests/test_train_device.py; } 2>&1 | tee "$LOG"
