"""Gemma 4's assistant drafter in mtpspec's loop (`core/assistant.py`): on tiny random Gemma 4
pairs, HF's own assisted generation runs them; mtpspec's AssistantDrafter proposes exactly the
drafts HF's `SinglePositionMultiTokenCandidateGenerator` proposes from the same state (prompts
shorter and longer than the sliding window); HF's sliding-window keys are pinned down as the last
W + 1 committed positions; greedy decoding with the drafter equals plain decoding token for
token (fp32 and bf16), and sampling with it runs and accepts drafts; a folder or target that
does not fit is refused with a sentence that says why."""

from __future__ import annotations

import pytest
import torch
from conftest import WINDOW, hf_greedy, quirky_model, tiny_model
from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4TextConfig, GenerationConfig
from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator

import mtpspec
from mtpspec import DraftInput, SamplingConfig, Target
from mtpspec.core.assistant import AssistantDrafter, is_assistant_dir, load_assistant
from mtpspec.core.decode import prefill
from mtpspec.errors import InputError

TARGETS = ["gemma4_text", "gemma4_text_e"]  # conftest's: 31B-style (k_eq_v, one full-attention KV head) and E-series
SHORT, LONG = 6, 21  # prompt lengths: inside the sliding window (8), and past W + 1


def gemma4_target(kind: str, seed: int = 0, tied: bool = False):
    """conftest's tiny Gemma 4 `kind`; `tied`: its embedding is its LM head too, which makes greedy
    text fall into repeating one token (for the echo assistant)."""
    return quirky_model(kind, seed, tie_word_embeddings=tied, initializer_range=0.3 if tied else 0.2)


def assistant_config(target, hidden_size: int = 16, **overrides) -> Gemma4AssistantConfig:
    """A 2-layer (sliding + full) assistant config whose attention reads `target`'s store layers:
    the same head dims and key/value heads per layer type."""
    t = target.config
    shape = {kind: t.per_layer_config[t.layer_types.index(kind)] for kind in ("sliding_attention", "full_attention")}
    text = Gemma4TextConfig(
        vocab_size=t.vocab_size, hidden_size=hidden_size, intermediate_size=32, num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"], num_attention_heads=t.num_attention_heads,
        head_dim=shape["sliding_attention"].head_dim, num_key_value_heads=shape["sliding_attention"].num_key_value_heads,
        global_head_dim=shape["full_attention"].head_dim, attention_k_eq_v=True,  # k_eq_v: full layers' own KV heads
        num_global_key_value_heads=shape["full_attention"].num_key_value_heads, sliding_window=t.sliding_window,
        rope_parameters=t.rope_parameters, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
        initializer_range=0.5)
    return Gemma4AssistantConfig(**{"text_config": text, "backbone_hidden_size": t.hidden_size, **overrides})


def gemma4_assistant(target, ordered: bool = False, seed: int = 1, **overrides) -> Gemma4AssistantForCausalLM:
    """A tiny random assistant for `target`. `ordered`: logits through 97 one-token centroids (the
    top 8 kept) under a random token order."""
    torch.manual_seed(seed)
    vocab = overrides.pop("vocab", target.config.vocab_size)
    cfg = assistant_config(target, use_ordered_embeddings=ordered, num_centroids=vocab, centroid_intermediate_top_k=8,
                           **overrides)
    cfg.text_config.vocab_size = vocab
    model = Gemma4AssistantForCausalLM(cfg).eval()
    if ordered:
        model.masked_embedding.token_ordering.copy_(torch.randperm(vocab))
    return model


def echo_assistant(target) -> Gemma4AssistantForCausalLM:
    """An assistant that drafts the last token again, k times: its input projection keeps the
    token's embedding, every sublayer adds nothing, and its LM head is the target's embedding
    table. Against a target that falls into repeating a token, rounds accept all their drafts,
    none, or some: every rollback runs."""
    D = target.config.hidden_size
    model = Gemma4AssistantForCausalLM(assistant_config(target, hidden_size=D)).eval()
    with torch.no_grad():
        model.pre_projection.weight.copy_(torch.cat([torch.eye(D), torch.zeros(D, D)], dim=1))  # (D, 2D): [I | 0]
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.copy_(target.model.embed_tokens.weight)
    return model


def prompt(T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 97, (1, T), generator=torch.Generator().manual_seed(seed))


def hf_candidates(model, assistant, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What HF's assisted loop drafts right after prefilling `ids`: (k,) tokens, (k, V) logits."""
    out = model(ids, output_hidden_states=True, return_shared_kv_states=True, use_cache=True)
    text = torch.cat([ids, out.logits[:, -1:].argmax(-1)], dim=1)  # (1, T + 1): the target's first token appended
    assistant.generation_config.num_assistant_tokens = k
    gen = SinglePositionMultiTokenCandidateGenerator(assistant, model.get_input_embeddings(),
                                                     GenerationConfig(max_length=10_000))
    cand, logits = gen.get_candidates(text, model_kwargs={"attention_mask": torch.ones_like(text)}, model_outputs=out,
                                      is_first_iteration=False, n_last_matches=0)
    return cand[0, text.shape[1]:], logits[0]


class HFCache:
    """HF's `shared_kv_states` after a prefill, read as mtpspec's `KVCache.layer` reads its own:
    the store layers' (1, Hk, L, hd) keys and values."""

    def __init__(self, shared_kv_states, stores: dict[str, int]):
        self.kv = {i: shared_kv_states[kind] for kind, i in stores.items()}
        self.length = next(iter(self.kv.values()))[0].shape[2]

    def layer(self, i: int):
        return self.kv[i]


@pytest.mark.parametrize("kind", TARGETS)
@pytest.mark.parametrize("ordered", [False, True])
def test_hf_assisted_generation_equals_hf_greedy(kind, ordered):
    model = gemma4_target(kind)
    assistant = gemma4_assistant(model, ordered)
    assistant.generation_config.num_assistant_tokens = 3
    ids = prompt(LONG)
    plain = hf_greedy(model, ids, 30, eos=[])
    assisted = model.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=[], pad_token_id=0,
                              assistant_model=assistant)
    assert len(set(plain[0, LONG:].tolist())) > 5  # a varied continuation, not one token repeated
    assert torch.equal(assisted, plain)


@pytest.mark.parametrize("kind", TARGETS)
@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("T", [SHORT, WINDOW, WINDOW + 1, LONG])
def test_drafts_equal_hf_candidates_after_prefill(kind, ordered, T):
    """From the state right after prefill, the drafter proposes HF's candidates, both from HF's
    own keys and hidden state and from mtpspec's prefill (its cache and features)."""
    model = gemma4_target(kind)
    assistant = gemma4_assistant(model, ordered)
    drafter = AssistantDrafter(assistant, model)
    ids, k = prompt(T, seed=T), 5
    want, want_logits = hf_candidates(model, assistant, ids, k)

    out = model(ids, output_hidden_states=True, return_shared_kv_states=True, use_cache=True)
    text = torch.cat([ids, out.logits[:, -1:].argmax(-1)], dim=1)
    hf_state = DraftInput(tokens=text, hidden=out.hidden_states[-1][:, -1], cache=HFCache(out.shared_kv_states,
                                                                                            drafter.stores))
    assert torch.equal(drafter.propose(hf_state, k, SamplingConfig(), None).tokens, want)
    # sampling: the first draft's q is the law HF's first logits give (later ones follow the draws)
    q = drafter.propose(hf_state, 1, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0)).q
    torch.testing.assert_close(q[0], want_logits[0].float().softmax(-1), atol=1e-5, rtol=1e-4)

    state, _ = prefill(drafter.target, ids, max_new_tokens=8)
    assert torch.equal(state.tokens, text)
    torch.testing.assert_close(state.hidden, out.hidden_states[-1][:, -1], atol=1e-5, rtol=1e-5)
    ours = DraftInput(tokens=state.tokens, hidden=state.hidden, cache=state.cache)
    assert torch.equal(drafter.propose(ours, k, SamplingConfig(), None).tokens, want)


@pytest.mark.parametrize("kind", TARGETS)
def test_hf_sliding_layers_see_the_last_window_plus_one_positions(kind):
    """HF's assistant masks its sliding layers' keys with a bidirectional window, |q_idx - kv_idx|
    <= W for its one query at index 0, flipped along the keys: it sees the last W + 1 keys it is
    given (the target's own sliding layer at position L sees W - 1 committed ones). Its logits
    from all L committed keys equal those from the last W + 1 alone, and differ from the last W."""
    model = gemma4_target(kind)
    assistant = gemma4_assistant(model)
    ids = prompt(LONG)
    out = model(ids, output_hidden_states=True, return_shared_kv_states=True, use_cache=True)
    kv = dict(out.shared_kv_states)
    x = torch.cat([model.get_input_embeddings()(ids[:, -1:]), out.hidden_states[-1][:, -1:]], dim=-1)  # (1, 1, 2D)

    def logits(n: int | None) -> torch.Tensor:
        k, v = kv["sliding_attention"]
        sliding = (k, v) if n is None else (k[:, :, -n:], v[:, :, -n:])
        with torch.no_grad():
            return assistant(inputs_embeds=x, position_ids=torch.tensor([[LONG]]), attention_mask=torch.ones(1, LONG + 1),
                             shared_kv_states={**kv, "sliding_attention": sliding}).logits

    full = logits(None)
    torch.testing.assert_close(logits(WINDOW + 1), full, atol=1e-5, rtol=1e-5)
    assert (logits(WINDOW) - full).abs().max() > 1e-3


# Per target kind, a (target seed, prompt seed) whose greedy text switches once from one repeated
# token to another, so that the echo assistant's drafts pass in part in the round that switches.
ECHO_CASES = {"gemma4_text": (2, 1), "gemma4_text_e": (1, 1)}


def test_hf_later_rounds_pass_keys_past_the_committed_text():
    """Why mtpspec matches HF's drafts only where HF hands over the committed keys (after prefill,
    and after a round that accepts every draft): after a round that rejects a draft, HF's loop
    passes the verify pass's keys, not the rolled-back cache's. Its full-attention entries are
    cut to the text's length L + 1, one slot past the L committed (slot L: a rejected draft's,
    at the query's own position); its sliding entries are the W - 1 cached before the round
    plus all k + 1 verified rows, rejected ones included, of which the mask shows the last W + 1."""
    model = gemma4_target(TARGETS[0])
    assistant = gemma4_assistant(model)
    assistant.generation_config.num_assistant_tokens = k = 3
    seen = {}  # query position L -> (sliding, full) key counts of its first draft step

    def record(module, args, kwargs):
        kv = kwargs["shared_kv_states"]
        seen.setdefault(int(kwargs["position_ids"]), (kv["sliding_attention"][0].shape[2],
                                                      kv["full_attention"][0].shape[2]))

    assistant.register_forward_pre_hook(record, with_kwargs=True)
    ids = prompt(LONG)
    model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=[], pad_token_id=0, assistant_model=assistant)
    rounds = sorted(seen.items())
    assert rounds[0] == (LONG, (LONG, LONG))  # after prefill: the committed keys, all of them
    checked = 0
    for (L, _), (L_next, kv) in zip(rounds, rounds[1:]):
        drafted = min(k, LONG + 12 - (L + 1) - 1)  # HF drafts fewer near max_length
        if L_next - L < drafted + 1:  # the round drafted from L rejected a draft
            assert kv == (WINDOW - 1 + drafted + 1, L_next + 1), (L, L_next, kv)
            checked += 1
    assert checked  # the random assistant's drafts mostly fail


@pytest.mark.parametrize("kind", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_with_the_assistant_equals_plain_decoding(kind, dtype, k):
    """Greedy output equals plain decoding token for token, with a random assistant (few drafts
    accepted; its cross-attention runs on mtpspec's cache) and an echo one against a target that
    falls into repeating a token (rounds accept none, some and all of their drafts)."""
    hist = [0] * (k + 1)
    seed, prompt_seed = ECHO_CASES[kind]
    random_pair, echo_target = gemma4_target(kind), gemma4_target(kind, seed, tied=True)
    for model, assistant, ids in ((random_pair, gemma4_assistant(random_pair, ordered=True), prompt(LONG)),
                                  (echo_target, echo_assistant(echo_target), prompt(LONG, prompt_seed))):
        model, assistant = model.to(dtype), assistant.to(dtype)
        plain = mtpspec.generate(model, None, ids, max_new_tokens=30, num_draft_tokens=0, eos_token_id=[]).sequences
        if dtype == torch.float32:
            assert torch.equal(plain, hf_greedy(model, ids, 30, eos=[]))
        drafter = AssistantDrafter(assistant, Target(model))
        out = mtpspec.generate(model, drafter, ids, max_new_tokens=30, num_draft_tokens=k, eos_token_id=[])
        assert torch.equal(out.sequences, plain)
        hist = [a + b for a, b in zip(hist, out.stats.accept_hist)]
    assert hist[0] and hist[k] and (k == 1 or any(hist[1:k])), hist


@pytest.mark.parametrize("kind", TARGETS)
def test_sampling_with_the_assistant_runs_and_accepts_drafts(kind):
    """Speculative sampling is exact in distribution, not per seed: here only that it runs, that
    the drafter hands back its q rows, and that drafts get accepted."""
    model = gemma4_target(kind)
    drafter = AssistantDrafter(gemma4_assistant(model), model)
    state, _ = prefill(drafter.target, prompt(LONG), max_new_tokens=8)
    sampling = SamplingConfig(temperature=1.5, seed=0)
    draft = drafter.propose(DraftInput(state.tokens, state.hidden, state.cache), 4, sampling,
                            torch.Generator().manual_seed(0))
    assert draft.q is not None and draft.q.shape == (4, 97)
    assert all(float(draft.q[i, t]) > 0 for i, t in enumerate(draft.tokens.tolist()))
    torch.testing.assert_close(draft.q.sum(-1), torch.ones(4))
    out = mtpspec.generate(model, drafter, prompt(LONG), max_new_tokens=60, num_draft_tokens=3, eos_token_id=[],
                           temperature=1.5, seed=0)
    assert out.sequences.shape == (1, LONG + 60)
    assert sum(out.stats.accept_hist[1:]) > 0, out.stats.accept_hist


def test_the_drafter_does_not_touch_the_target_cache():
    model = gemma4_target("gemma4_text_e")
    drafter = AssistantDrafter(gemma4_assistant(model), model)
    state, _ = prefill(drafter.target, prompt(LONG), max_new_tokens=8)
    before = [tuple(t.clone() for t in state.cache.layer(i)) for i in range(drafter.target.num_layers)]
    drafter.propose(DraftInput(state.tokens, state.hidden, state.cache), 5, SamplingConfig(), None)
    assert state.cache.length == LONG
    for i in range(drafter.target.num_layers):
        assert all(torch.equal(a, b) for a, b in zip(before[i], state.cache.layer(i)))


def test_load_assistant_reads_a_saved_folder(tmp_path):
    model = gemma4_target(TARGETS[0])
    assistant = gemma4_assistant(model, ordered=True)
    assistant.save_pretrained(tmp_path / "assistant")
    assert is_assistant_dir(tmp_path / "assistant") and not is_assistant_dir(tmp_path)
    loaded = load_assistant(tmp_path / "assistant", model)
    state, _ = prefill(loaded.target, prompt(LONG), max_new_tokens=8)
    inp = DraftInput(state.tokens, state.hidden, state.cache)
    want = AssistantDrafter(assistant, model).propose(inp, 4, SamplingConfig(), None).tokens
    assert torch.equal(loaded.propose(inp, 4, SamplingConfig(), None).tokens, want)
    assert load_assistant(tmp_path / "assistant", model.to(torch.bfloat16)).assistant.dtype == torch.bfloat16


def test_load_assistant_refuses_what_does_not_fit(tmp_path):
    model = gemma4_target(TARGETS[0])
    model.save_pretrained(tmp_path / "target")
    gemma4_assistant(model, backbone_hidden_size=48).save_pretrained(tmp_path / "wide")
    gemma4_assistant(model, vocab=89).save_pretrained(tmp_path / "vocab")
    gemma4_assistant(model).save_pretrained(tmp_path / "ok")
    with pytest.raises(InputError, match="not a Gemma 4 assistant folder"):
        load_assistant(tmp_path / "target", model)
    with pytest.raises(InputError, match="not a Gemma 4 assistant folder"):
        load_assistant(tmp_path / "missing", model)
    with pytest.raises(InputError, match="hidden size 48, but this target's is 32"):
        load_assistant(tmp_path / "wide", model)
    with pytest.raises(InputError, match=r"vocabulary \(89 tokens\) differs from the target's \(97\)"):
        load_assistant(tmp_path / "vocab", model)
    with pytest.raises(InputError, match="drafts for a Gemma 4 text model"):
        load_assistant(tmp_path / "ok", tiny_model("llama"))
    with pytest.raises(InputError, match="drafts for a Gemma 4 text model"):
        load_assistant(tmp_path / "ok", Target(tiny_model("llama")))


def test_cli_generate_with_an_assistant_folder_equals_plain_decoding(tmp_path):
    """`mtpspec generate --target GEMMA4_DIR --head ASSISTANT_DIR --compare`: the assistant drafts
    in mtpspec's loop, the text is plain decoding's (and HF's greedy), and a command that needs an
    MTP head refuses the folder with the reason."""
    import json

    from conftest import save_tiny_model_dir
    from typer.testing import CliRunner

    from mtpspec.cli import app
    from mtpspec.pretrained import load_head

    model, tok = save_tiny_model_dir(tmp_path / "target", "gemma4_text")
    gemma4_assistant(model).save_pretrained(tmp_path / "assistant")
    r = CliRunner().invoke(app, ["generate", "--target", str(tmp_path / "target"), "--head", str(tmp_path / "assistant"),
                                 "--prompt", "w7 w8 w9", "-n", "16", "-k", "3", "--compare", "--json", "--dtype", "fp32"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout.strip().splitlines()[-1])
    assert obj["plain"]["identical"] and obj["num_draft_tokens"] == 3 and obj["memory"]["head_bytes"] > 0
    ids = tok.apply_chat_template([{"role": "user", "content": "w7 w8 w9"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    assert obj["token_ids"] == hf_greedy(model, ids, 16, eos=3)[0, ids.shape[1]:].tolist()
    with pytest.raises(InputError, match="is a Gemma 4 assistant, not an mtpspec head"):
        load_head(tmp_path / "assistant", model)


def test_bench_switch_and_hybrid_run_a_gemma4_assistant_exactly(tmp_path):
    """`mtpspec bench --head ASSISTANT_DIR --methods k0,mtp,switch,hybrid`: the assistant drafts the
    mtp chains, the switch's non-lookup rounds and the hybrid's chain beside the lookup branch,
    every output equals k0's, its memory is its own weights; a tree from it is refused with the
    reason; `acceptance` counts its chains."""
    import json

    from conftest import save_tiny_model_dir
    from test_bench import PROMPTS, write_prompts
    from typer.testing import CliRunner

    from mtpspec.cli import app
    from mtpspec.core.drafters import build_drafter

    model, _ = save_tiny_model_dir(tmp_path / "target", "gemma4_text")
    assistant = gemma4_assistant(model)
    assistant.generation_config.num_assistant_tokens = 3
    assistant.save_pretrained(tmp_path / "assistant")
    out = tmp_path / "report"
    r = CliRunner().invoke(app, ["bench", "--target", str(tmp_path / "target"), "--head", str(tmp_path / "assistant"),
                                 "--methods", "k0,mtp,switch,hybrid", "--prompts", str(write_prompts(tmp_path / "p.jsonl")),
                                 "--max-new-tokens", "12", "-k", "3", "--threads", "1", "--no-progress", "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    overall = {s["method"]: s for s in res["summaries"] if s["category"] == "all"}
    assert overall["mtp"]["identical_k0"] == overall["switch"]["identical_k0"] == overall["hybrid"]["identical_k0"] \
        == len(PROMPTS)
    dtype = getattr(torch, res["info"]["dtype"])  # the bench's (auto: bf16 where the CPU has it)
    loaded = load_assistant(tmp_path / "assistant", model.to(dtype))
    assert res["memory"]["mtp"]["param_bytes"] == loaded.inference_bytes() > 0
    with pytest.raises(InputError, match="assistant drafts chains"):
        build_drafter(load_assistant(tmp_path / "assistant", model), "tree")
    r = CliRunner().invoke(app, ["acceptance", "--target", str(tmp_path / "target"), "--head", str(tmp_path / "assistant"),
                                 "--prompts", str(tmp_path / "p.jsonl"), "-k", "1,2", "-n", "8", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert "k=1" in r.output and "k=2" in r.output
    r = CliRunner().invoke(app, ["costs", "--target", str(tmp_path / "target"), "--head", str(tmp_path / "assistant"),
                                 "--max-n", "3", "--reps", "1", "--context", "16", "--bandwidth-mib", "0", "--json"])
    assert r.exit_code == 0, r.output
    c = json.loads(r.stdout.strip().splitlines()[-1])
    assert c["draft_step_ms"] > 0 and c["draft_vocab"] == 97 and c["round_costs"] is None  # no tree from an assistant


def test_a_server_drafts_with_an_assistant_and_replies_as_plain_decoding(tmp_path):
    """`mtpspec serve --head ASSISTANT_DIR` (the batching engine, several requests at once): each
    reply is that request's plain decoding."""
    import asyncio

    from conftest import save_tiny_model_dir

    from mtpspec.models import chat_ids
    from mtpspec.serve import load_engine
    from mtpspec.serve.engine import DecodeRequest

    model, tok = save_tiny_model_dir(tmp_path / "target", "gemma4_text")
    gemma4_assistant(model).save_pretrained(tmp_path / "assistant")
    engine = load_engine(str(tmp_path / "target"), tmp_path / "assistant", "fp32", 3, max_running=4)
    prompts = [chat_ids(tok, p) for p in ("w7 w8 w9", "w10 w11", "w12 w13 w14 w15")]
    plain = [mtpspec.generate(engine.target, None, ids, max_new_tokens=16, num_draft_tokens=0).sequences[0, ids.shape[1]:]
             .tolist() for ids in prompts]

    async def run() -> list[list[int]]:
        jobs = [engine.submit(DecodeRequest(ids, 16, SamplingConfig())) for ids in prompts]
        outs = []
        for job in jobs:
            out = []
            while (c := await job.next(30)) is not None:
                out += c.token_ids
            outs.append(out)
        return outs

    try:
        assert isinstance(engine.drafter, AssistantDrafter) and engine.config.num_draft_tokens == 3
        assert asyncio.run(run()) == plain
    finally:
        engine.close()


def test_data_drafted_by_an_assistant_is_the_set_plain_decoding_writes(tmp_path):
    """`mtpspec data --engine batch --head ASSISTANT_DIR` on a Gemma 4 target: the assistant drafts
    the greedy answers, and the set is the one written without drafts, shard for shard."""
    import json

    from conftest import save_tiny_model_dir
    from typer.testing import CliRunner

    from mtpspec.cli import app
    from mtpspec.training.shards import load_samples

    model, _ = save_tiny_model_dir(tmp_path / "target", "gemma4_text")
    gemma4_assistant(model).save_pretrained(tmp_path / "assistant")
    runner = CliRunner()
    base = ["data", "--target", str(tmp_path / "target"), "--num-samples", "6", "--batch-size", "3",
            "--max-response-tokens", "12", "--max-prompt-tokens", "8", "--engine", "batch", "--dtype", "fp32",
            "--threads", "1"]
    for name, extra in (("plain", []), ("drafted", ["--head", str(tmp_path / "assistant")])):
        r = runner.invoke(app, [*base, "--out", str(tmp_path / name), *extra])
        assert r.exit_code == 0, r.output
    plain, drafted = (load_samples(tmp_path / n) for n in ("plain", "drafted"))
    assert len(plain) == len(drafted) > 0
    assert all(torch.equal(a, b) and pa == pb for (a, pa), (b, pb) in zip(plain, drafted))
    assert json.loads((tmp_path / "drafted" / "manifest.json").read_text())["settings"]["generation"]["engine"] == \
        "mtpspec-batch"
