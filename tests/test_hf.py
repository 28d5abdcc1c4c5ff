"""`model.generate(..., custom_generate=mtpspec.hf.custom_generate(head))` on tiny fp32 models:
greedy output identical to plain `model.generate`, streamers fed, unsupported settings refused."""

from __future__ import annotations

import pytest
import torch
from conftest import save_tiny_model_dir, tiny_model
from transformers import TextIteratorStreamer

from mtpspec import InputError, MTPHead
from mtpspec.hf import custom_generate

PROMPTS = [[5, 6, 7], [11, 40, 12, 13, 90], [60]]


def plain(model, ids, n, **kw):
    return model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0, **kw)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_custom_generate_equals_plain_generate(family, k):
    model = tiny_model(family)
    fn = custom_generate(MTPHead.for_target(model), num_draft_tokens=k)
    for p in PROMPTS:
        ids = torch.tensor([p])
        want = plain(model, ids, 24)
        got = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=0, custom_generate=fn)
        assert torch.equal(got, want)


def test_eos_token_id_ends_the_reply_where_plain_generate_ends_it():
    model = tiny_model()
    fn = custom_generate(MTPHead.for_target(model), num_draft_tokens=3)
    ids = torch.tensor([PROMPTS[0]])
    free = plain(model, ids, 24, eos_token_id=[])[0, 3:].tolist()
    eos = free[6]  # a token the reply reaches: both must stop at its first occurrence
    want = plain(model, ids, 24, eos_token_id=eos)
    got = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=0, eos_token_id=eos, custom_generate=fn)
    assert torch.equal(got, want) and got.shape[1] == 3 + free.index(eos) + 1


def test_a_streamer_gets_the_prompt_then_every_new_token_then_end(tmp_path):
    model, tok = save_tiny_model_dir(tmp_path)
    head = MTPHead.for_target(model)
    ids = torch.tensor([PROMPTS[1]])

    class Recorder:
        def __init__(self):
            self.puts, self.ends = [], 0

        def put(self, value):
            self.puts.append(value.tolist())

        def end(self):
            self.ends += 1

    rec = Recorder()
    out = model.generate(ids, max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=[],
                         custom_generate=custom_generate(head, 3, streamer=rec))
    assert rec.puts[0] == ids.tolist() and rec.ends == 1
    assert [t for chunk in rec.puts[1:] for t in chunk] == out[0, ids.shape[1]:].tolist()

    streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True)
    out = model.generate(ids, max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=[],
                         custom_generate=custom_generate(head, 3, streamer=streamer))
    assert "".join(streamer).strip() == tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


def test_sampling_is_reproducible_under_torch_manual_seed_and_returns_a_dict_when_asked():
    model = tiny_model()
    fn = custom_generate(MTPHead.for_target(model), 2)
    ids = torch.tensor([PROMPTS[0]])
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        runs.append(model.generate(ids, max_new_tokens=16, do_sample=True, temperature=1.3, top_k=30, pad_token_id=0,
                                   eos_token_id=[], custom_generate=fn))
    assert torch.equal(runs[0], runs[1]) and runs[0].shape == (1, 3 + 16)
    assert not torch.equal(runs[0], plain(model, ids, 16, eos_token_id=[]))  # sampled, not greedy
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0, return_dict_in_generate=True,
                         custom_generate=fn)
    assert torch.equal(out.sequences, plain(model, ids, 4))


def test_settings_it_cannot_honour_exactly_are_refused():
    model = tiny_model()
    head = MTPHead.for_target(model)
    fn = custom_generate(head, 2)
    ids = torch.tensor([PROMPTS[0]])
    with pytest.raises(InputError, match="RepetitionPenaltyLogitsProcessor"):
        model.generate(ids, max_new_tokens=4, repetition_penalty=1.3, pad_token_id=0, custom_generate=fn)
    with pytest.raises(InputError, match="attention mask"):
        model.generate(ids, attention_mask=torch.tensor([[0, 1, 1]]), max_new_tokens=4, pad_token_id=0, custom_generate=fn)
    with pytest.raises(InputError, match="another model object"):
        tiny_model().generate(ids, max_new_tokens=4, pad_token_id=0, custom_generate=fn)
