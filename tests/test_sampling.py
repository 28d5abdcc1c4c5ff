"""Sampled decoding is lossless: `generate` with a drafter whose q differs from the target's p
emits continuations distributed exactly as the target's own sampling with the same
temperature / top-k / top-p. Checked against the exact law of every continuation of a
tiny-vocabulary target (chi-square), with a misreporting drafter that the same check rejects;
the same for draft trees (the head's tree, the hybrid), for drafts without q, verified as point
masses, and for an independent draft model. Also: seeds are reproducible, the global RNG is left
alone, and `probs_from_logits` is HF's.

V vocabulary, NEW new tokens per sample.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import chisquare_pvalue, tiny_model, tree_probs_without_renormalisation
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import mtpspec
from mtpspec import Draft, HeadConfig, MTPHead, SamplingConfig, Target
from mtpspec.core import sampling
from mtpspec.core.draft_model import DraftModelDrafter
from mtpspec.core.drafters import HybridDrafter, RoundCosts, TreeConfig, TreeDrafter
from mtpspec.core.sampling import probs_from_logits

V = 6
NEW = 4  # the prefill's token, then rounds of up to 2 drafts + the target's token
PROMPT = torch.tensor([[1, 2, 0]])
SAMPLES = 3000


def _small_vocab_target():
    # One layer at initializer_range 0.3: peaked enough that p is far from uniform, flat enough
    # that many continuations are likely, and the untrained head's q differs from p so that
    # every acceptance length occurs.
    return tiny_model(
        "llama", vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, initializer_range=0.3,
    )


@torch.no_grad()
def exact_law(model, cfg: SamplingConfig) -> np.ndarray:
    """(V**NEW,) probability of each continuation under the target's own sampling; cell index
    = the continuation's tokens read as base-V digits (itertools.product order)."""
    conts = torch.tensor(list(itertools.product(range(V), repeat=NEW)))  # (C, NEW)
    ids = torch.cat([PROMPT.expand(len(conts), -1), conts], dim=1)  # (C, T + NEW)
    logits = model(ids).logits[:, PROMPT.shape[1] - 1:-1]  # (C, NEW, V): row j predicts token j
    p = probs_from_logits(logits.reshape(-1, V), cfg).reshape(len(conts), NEW, V)
    return p.double().gather(-1, conts[..., None]).squeeze(-1).prod(-1).numpy()


def sampled_counts(model, drafter, k: int, cfg: SamplingConfig) -> tuple[np.ndarray, list[int]]:
    """Counts of the continuations of SAMPLES seeded `generate` calls, and the summed
    acceptance histogram."""
    counts = np.zeros(V**NEW)
    hist = [0] * (k + 1)
    for seed in range(SAMPLES):
        out = mtpspec.generate(
            model, drafter, PROMPT, max_new_tokens=NEW, num_draft_tokens=k, eos_token_id=[],
            temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seed=seed,
        )
        new = out.sequences[0, PROMPT.shape[1]:].tolist()
        assert len(new) == NEW
        counts[int(np.ravel_multi_index(new, (V,) * NEW))] += 1
        hist = [a + b for a, b in zip(hist, out.stats.accept_hist)]
    return counts, hist


class MisreportingDrafter:
    """Draws its tokens from the head's q but reports a uniform q: the acceptance ratio is then
    computed against the wrong distribution and the output is no longer the target's."""

    hidden_layers = (-1,)

    def __init__(self, head: MTPHead):
        self.head = head

    def propose(self, inp, k, sampling, generator):
        d = self.head.propose(inp, k, sampling, generator)
        return Draft(tokens=d.tokens, q=torch.full_like(d.q, 1.0 / d.q.shape[-1]))

    def update(self, drafted, accepted):
        pass


SETTINGS = {
    # name: (sampling, num_draft_tokens, head config)
    "t1.0": (SamplingConfig(temperature=1.0), 2, HeadConfig()),
    "t0.7_k4_p0.9": (SamplingConfig(temperature=0.7, top_k=4, top_p=0.9), 3, HeadConfig()),
    # a reduced draft vocabulary (ids 0..3): q is 0 on tokens 4, 5 where p is not
    "t1.0_draft_vocab4": (SamplingConfig(temperature=1.0), 2, HeadConfig(draft_vocab_size=4)),
}


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.slow
def test_speculative_sampling_matches_the_target_distribution(setting):
    cfg, k, head_cfg = SETTINGS[setting]
    model = _small_vocab_target()
    counts, hist = sampled_counts(model, MTPHead.for_target(model, head_cfg), k, cfg)
    # The check is only meaningful if drafts were both rejected and accepted, at every length
    # a round could reach (with NEW = 4 a round drafts at most 2).
    assert all(hist[n] > 0 for n in range(3)), hist
    assert chisquare_pvalue(counts, exact_law(model, cfg)) > 1e-3


@pytest.mark.slow
def test_the_distribution_check_rejects_a_misreported_q():
    cfg, k, head_cfg = SETTINGS["t1.0"]
    model = _small_vocab_target()
    counts, _ = sampled_counts(model, MisreportingDrafter(MTPHead.for_target(model, head_cfg)), k, cfg)
    assert chisquare_pvalue(counts, exact_law(model, cfg)) < 1e-6


class Recording:
    """Wraps a drafter, counting the drafts that were trees rather than chains; `drop_q` hides
    the law the tokens were drawn from, so they are verified as point masses."""

    def __init__(self, drafter, drop_q: bool = False):
        self.drafter, self.drop_q = drafter, drop_q
        self.hidden_layers = drafter.hidden_layers
        self.trees = 0

    def propose(self, inp, k, sampling, generator):
        d = self.drafter.propose(inp, k, sampling, generator)
        self.trees += not d.is_chain
        return Draft(tokens=d.tokens, parents=d.parents, q=None if self.drop_q else d.q)

    def update(self, drafted, accepted):
        self.drafter.update(drafted, accepted)


class TargetTopTree:
    """A deterministic tree of the target's own most likely tokens: its top-3 under the root,
    then its top-2 after the first of them. Siblings are each likely, so how a sibling is
    tested after an earlier one failed moves the output law a lot."""

    hidden_layers = (-1,)

    def __init__(self, model):
        self.model = model

    @torch.no_grad()
    def propose(self, inp, k, sampling, generator):
        top = self.model(inp.tokens).logits[0, -1].topk(3).indices  # (3,)
        after = self.model(torch.cat([inp.tokens, top[None, :1]], 1)).logits[0, -1].topk(2).indices  # (2,)
        return Draft(tokens=torch.cat([top, after])[:k], parents=torch.tensor([-1, -1, -1, 0, 0])[:k])

    def update(self, drafted, accepted):
        pass


SAMPLED_DRAFTERS = {
    # name: drafter built on the head
    "tree": lambda head: Recording(TreeDrafter(head, TreeConfig(width=2, beam=2))),
    # shaped per round from the rounds before it (a branch only where it pays)
    "tree_by_cost": lambda head: Recording(TreeDrafter(head, TreeConfig(width=2, beam=2, costs=RoundCosts(0.0, 0.05, 0.0)))),
    "hybrid": lambda head: Recording(HybridDrafter(head, TreeConfig(width=2, beam=2), lookup_tokens=1)),
    # the head's chain, its q dropped: drawn from q, verified as point masses
    "chain_without_q": lambda head: Recording(head, drop_q=True),
    "target_top_tree": lambda head: Recording(TargetTopTree(head.target.model)),
}


@pytest.mark.parametrize("name", list(SAMPLED_DRAFTERS))
@pytest.mark.slow
def test_trees_and_drafts_without_q_sample_the_target_distribution(name):
    cfg = SamplingConfig(temperature=1.0)
    model = _small_vocab_target()
    drafter = SAMPLED_DRAFTERS[name](MTPHead.for_target(model))
    counts, hist = sampled_counts(model, drafter, 3, cfg)
    assert hist[0] > 0 and hist[1] > 0, hist  # drafts both rejected and accepted
    assert (drafter.trees > 0) == (name != "chain_without_q")  # real trees were verified
    assert chisquare_pvalue(counts, exact_law(model, cfg)) > 1e-3


@pytest.mark.slow
def test_an_independent_draft_model_samples_the_target_distribution():
    """A standalone draft model (its own embedding and KV cache, `core/draft_model.py`) drafts
    from its own q; the output is still the target's law."""
    cfg = SamplingConfig(temperature=0.8, top_p=0.95)
    model = _small_vocab_target()
    other = tiny_model("llama", seed=5, vocab_size=V, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, initializer_range=0.3)
    counts, hist = sampled_counts(model, DraftModelDrafter(other, Target(model)), 2, cfg)
    assert all(hist[n] > 0 for n in range(3)), hist
    assert chisquare_pvalue(counts, exact_law(model, cfg)) > 1e-3


@pytest.mark.slow
def test_the_tree_check_rejects_a_rule_without_renormalisation(monkeypatch):
    """The check above has power: testing later siblings against an unnormalised residual
    (patched into the sampler) moves the output off the target's law."""
    import mtpspec.core.verify as verify

    monkeypatch.setattr(verify, "speculative_tree_probs", tree_probs_without_renormalisation)
    cfg = SamplingConfig(temperature=1.0)
    model = _small_vocab_target()
    counts, _ = sampled_counts(model, SAMPLED_DRAFTERS["target_top_tree"](MTPHead.for_target(model)), 3, cfg)
    assert chisquare_pvalue(counts, exact_law(model, cfg)) < 1e-6


# -- reproducibility and RNG hygiene -------------------------------------------------------------


def _sample(model, drafter, seed, **kw):
    return mtpspec.generate(
        model, drafter, torch.tensor([[5, 17, 42, 8]]), max_new_tokens=20, num_draft_tokens=3,
        eos_token_id=[], temperature=1.0, seed=seed, **kw,
    ).sequences


def test_same_seed_same_output_different_seeds_differ():
    model = tiny_model("llama")
    head = MTPHead.for_target(model)
    first = _sample(model, head, 0)
    assert torch.equal(first, _sample(model, head, 0))
    outputs = {tuple(_sample(model, head, s)[0].tolist()) for s in range(4)}
    assert len(outputs) == 4


@pytest.mark.parametrize("seed", [0, None])
def test_sampling_leaves_the_global_rng_alone(seed):
    model = tiny_model("llama")
    head = MTPHead.for_target(model)  # its init draws from the global RNG: before the snapshot
    before = torch.get_rng_state()
    _sample(model, head, seed, top_k=20, top_p=0.9)
    assert torch.equal(torch.get_rng_state(), before)


# -- probs_from_logits is Hugging Face's warper chain ---------------------------------------------


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.9), (0.7, 4, 0.9), (2.0, 10, 0.5),
     (0.5, 1, 1.0), (1.0, 0, 0.05), (1.0, 100, 0.95)],
)
@pytest.mark.parametrize("ties", [False, True])
def test_probs_from_logits_matches_hf_warpers(temperature, top_k, top_p, ties):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 50, generator=g) * 3
    if ties:  # integer logits: many tokens tie at the top-k and top-p boundaries
        logits = logits.round()
    ids = torch.zeros(8, 1, dtype=torch.long)
    scores = TemperatureLogitsWarper(temperature)(ids, logits.clone())
    if top_k:
        scores = TopKLogitsWarper(top_k)(ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(ids, scores)
    ours = probs_from_logits(logits, SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p))
    torch.testing.assert_close(ours, scores.softmax(-1), atol=1e-6, rtol=0)
    assert torch.equal(ours == 0, scores.softmax(-1) == 0)  # the same tokens are cut


@pytest.mark.parametrize("shape", [(50,), (3, 50), (1, 4097), (2, 49_152)])
def test_multinomial_draws_what_torch_draws_and_leaves_the_generator_alike(shape):
    """`sampling.multinomial` computes only the nucleus's Exp(1) variates: each draw, and the
    generator's state after it, equal torch.multinomial's, from fresh seeds and from states
    part-way through the twister's 624 words (the draws before move it), with tokens at p = 0."""
    g = torch.Generator().manual_seed(sum(shape))
    for trial in range(12):
        probs = torch.rand(shape, generator=g) ** 4
        if trial % 3:
            probs = probs * (torch.rand(shape, generator=g) < 0.05)  # a nucleus: most tokens at 0
            probs.view(-1, shape[-1])[:, trial] += 0.1  # every row keeps one
        probs = probs / probs.sum(-1, keepdim=True)
        ours, theirs = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        for gen in (ours, theirs):
            torch.rand(trial * 97, generator=gen)  # the same draws before, any position in the state
        for _ in range(3):
            a = sampling.multinomial(probs, ours)
            b = torch.multinomial(probs, 1, generator=theirs)
            assert torch.equal(a, b), trial
            assert torch.equal(ours.get_state(), theirs.get_state()), trial
        assert torch.equal(torch.rand(5, generator=ours), torch.rand(5, generator=theirs))


def test_multinomial_leaves_what_it_cannot_read_to_torch():
    probs = torch.tensor([[0.2, 0.8], [0.5, 0.5]])
    g = torch.Generator().manual_seed(0)
    assert sampling.multinomial(probs.t(), g).shape == (2, 1)  # not contiguous: torch draws
    assert sampling.multinomial(probs.double(), g).shape == (2, 1)
    with pytest.raises(RuntimeError):
        sampling.multinomial(torch.tensor([0.0, 0.0]), g)  # torch's own error


@pytest.mark.parametrize("shape", [(1, 49_152), (7, 4_099), (3, 17), (2, 16), (5, 300)])
def test_top_p_drops_the_tokens_torchs_sort_drops_ties_included(shape):
    """`top_p_drop` (numpy's sorted values, then nucleus.c's partitions on the cut's side only)
    drops exactly the tokens torch's unstable sort puts below the cut, where bf16 logits tie in
    large groups, with -inf from a top-k, across temperatures and top_p. A selection that orders
    ties in any other way (here: a stable sort) fails it."""
    so = sampling._nucleus_built()
    if so is None:
        pytest.skip("nucleus.c is not built here (no C compiler, or not x86-64)")
    assert sampling._nucleus() is so  # its first-use check passed: it is what top_p_drop runs
    g = torch.Generator().manual_seed(shape[-1])
    stable_differs = False
    for trial in range(8):
        scale = (0.3, 1.0, 3.0, 8.0)[trial % 4]
        x = (torch.randn(shape, generator=g) * scale).bfloat16().float() / (0.7, 1.0)[trial % 2]
        if trial % 3 == 2:  # a top-k before: -inf in most places
            x = x.masked_fill(x < x.topk(min(5, shape[-1]), dim=-1).values[:, -1:], float("-inf"))
        for top_p in (0.05, 0.5, 0.9, 0.99):
            want = sampling._top_p_drop_torch(x, top_p)
            assert torch.equal(sampling._top_p_drop_native(x.contiguous(), top_p, so), want), (trial, top_p)
            assert torch.equal(sampling.top_p_drop(x, top_p), want), (trial, top_p)
            _, idx = torch.sort(x, dim=-1, stable=True)
            cum = x.gather(-1, idx).softmax(-1).cumsum(-1)
            ds = cum <= 1 - top_p
            ds[..., -1] = False
            stable_differs |= not torch.equal(ds.scatter(-1, idx, ds), want)
    assert stable_differs or shape[-1] <= 17  # the ties matter: a stable order drops other tokens


def test_top_p_drop_leaves_what_it_cannot_read_to_torch():
    x = torch.tensor([[1.0, float("nan"), 0.5], [0.0, 0.0, 1.0]])
    torch.testing.assert_close(sampling.top_p_drop(x, 0.5), sampling._top_p_drop_torch(x, 0.5))
    assert torch.equal(sampling.top_p_drop(x.double(), 0.5), sampling._top_p_drop_torch(x.double(), 0.5))
