"""Grow a saved head by one cross-attention block that starts as the identity (its two output
projections zero), so the grown head drafts exactly as the saved one until training moves it.

    python reports/heads/copy-and-grow/grow.py HEAD_DIR OUT_DIR
"""
import dataclasses
import sys

import torch

from mtpspec.core.head import MTPHead
from mtpspec.core.target import Target
from mtpspec.models import load_target
from mtpspec.pretrained import load_head

t = Target(load_target(None, "fp32").model)
old = load_head(sys.argv[1], t)
torch.manual_seed(0)  # the new block's query and gate/up weights are drawn (std 0.02)
grown = MTPHead(t, dataclasses.replace(old.config, num_blocks=old.config.num_blocks + 1), old.draft_ids)
missing, unexpected = grown.load_state_dict(old.state_dict(), strict=False)
assert not unexpected and all(k.startswith(f"blocks.{old.config.num_blocks}.") for k in missing), (missing, unexpected)
new = grown.blocks[-1]
with torch.no_grad():
    new.o_proj.weight.zero_()
    new.down.weight.zero_()
grown.recommended_k = old.recommended_k
# same drafts before training: check on random inputs
x, ids = torch.randn(1, 5, t.hidden_size), torch.randint(0, 1000, (1, 5))
kv = torch.randn(2, 1, t.model.config.num_key_value_heads, 5, t.head_dim)
assert all(torch.allclose(a[1], b[1], atol=1e-5) for a, b in zip(old(x, ids, kv[0], kv[1], 2), grown(x, ids, kv[0], kv[1], 2)))
grown.save_pretrained(sys.argv[2])
print(f"{sys.argv[2]}: {grown.num_parameters():,} parameters ({old.num_parameters():,} before)")
