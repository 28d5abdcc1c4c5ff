"""The one decode loop: `prefill` once, then `step` until done. `generate` is that loop.

Letters: T prompt length, N drafts in a round (a chain of k, or a tree of k nodes), M = N + 1
verify rows, V vocabulary, F drafter features.

Invariant between steps: the target's cache holds positions 0..L-1, `state.hidden` is the
target's features at L-1, and `state.tokens[-1]` (position L) is the target's own choice for
the next token, already emitted but not yet run through the target. Streaming, the CLI and a
server drive `step` directly; nothing here keeps state outside the `DecodeState`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import AcceptanceConfig, SamplingConfig
from ..errors import InputError
from .cache import KVCache
from .draft import Draft, Drafter, DraftInput
from .drafters import build_drafter
from .kernels import R_MAX
from .sampling import make_generator, probs_from_logits, sample
from .stats import DecodeStats
from .target import Target, TargetStep
from .tree import TreeLayout, spine_first
from .verify import accept

MAX_TREE_SLACK = 64  # cache slots past prompt + max_new_tokens that a verify pass may use


@dataclass
class DecodeState:
    """Everything one request carries between steps."""

    cache: KVCache  # the target's, L committed positions
    tokens: torch.Tensor  # (1, L + 1): prompt + emitted tokens; the last is not yet in the cache
    hidden: torch.Tensor  # (1, F) target features at position L - 1, for the drafter
    prompt_length: int
    max_new_tokens: int
    eos: frozenset[int]
    sampling: SamplingConfig
    generator: torch.Generator | None
    hidden_layers: tuple[int, ...]
    stats: DecodeStats
    done: bool = False
    # Which drafts a round accepts: exact (the target's own output) unless a relaxed rule is asked for.
    acceptance: AcceptanceConfig = AcceptanceConfig()
    # The drafter's scratch for this request between rounds (`DraftInput.memo`); it goes with the request.
    draft_memo: dict = field(default_factory=dict)

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[0, self.prompt_length:].tolist()

    @property
    def num_new(self) -> int:
        return self.tokens.shape[1] - self.prompt_length


@dataclass(frozen=True)
class Round(Sequence[int]):
    """What one round emitted, already appended to the state: its tokens in order and, for each,
    whether it was a draft the target accepted. Accepted drafts come first; the target's own
    token, when the round kept it (not cut by EOS or max_new_tokens), comes last. A round is a
    sequence of its token ids, so `for tok in step(...)` reads as before."""

    tokens: tuple[int, ...]
    drafted: tuple[bool, ...]  # per token: an accepted draft (True) or the target's own (False)

    def __post_init__(self) -> None:
        if len(self.drafted) != len(self.tokens):
            raise ValueError(f"a round of {len(self.tokens)} tokens needs as many drafted flags, got {len(self.drafted)}")

    @property
    def accepted(self) -> int:
        """How many of the tokens were accepted drafts."""
        return sum(self.drafted)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        return self.tokens[i]


@dataclass
class GenerateOutput:
    sequences: torch.Tensor  # (1, T + n): prompt then new tokens, as HF generate returns
    stats: DecodeStats


def resolve_eos(target: Target, eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        gc = getattr(target.hf_model, "generation_config", None)
        eos_token_id = getattr(gc, "eos_token_id", None)
    if eos_token_id is None:
        return frozenset()
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return frozenset(int(i) for i in ids)


def _pick(logits: torch.Tensor, sampling: SamplingConfig, gen: torch.Generator | None) -> int:
    """(V,) -> the target's own token: argmax, or a draw from its distribution."""
    if sampling.greedy:
        return int(logits.argmax())
    return int(sample(probs_from_logits(logits[None], sampling), gen))


def _emit(state: DecodeState, accepted: list[int], drafted: int = 0) -> Round:
    """Append a round's tokens (its first `drafted` are accepted drafts), stopping at the first
    EOS and at max_new_tokens."""
    for j, tok in enumerate(accepted):
        if tok in state.eos:
            accepted = accepted[: j + 1]
            break
    accepted = accepted[: state.max_new_tokens - state.num_new]
    state.tokens = torch.cat([state.tokens, state.tokens.new_tensor([accepted])], dim=1)
    state.stats.new_tokens = state.num_new
    state.done = accepted[-1] in state.eos or state.num_new >= state.max_new_tokens
    return Round(tokens=tuple(accepted), drafted=tuple(j < drafted for j in range(len(accepted))))


def open_state(
    target: Target,
    input_ids: torch.Tensor,
    max_new_tokens: int = 128,
    hidden_layers: tuple[int, ...] = (-1,),
    sampling: SamplingConfig | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    num_draft_tokens: int = 0,
    acceptance: AcceptanceConfig | str | None = None,
) -> DecodeState:
    """A request's state before its prompt has run: checked input, an empty cache of the
    request's own capacity, its generator. `prefill` runs the prompt on it at once; a batch
    (`batch.py`) in chunks, then both call `finish_prefill`."""
    sampling = sampling or SamplingConfig()
    acceptance = AcceptanceConfig.parse(acceptance)
    input_ids = _check_input(input_ids, target)
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
    T = input_ids.shape[1]
    target.check_length(T + max_new_tokens)
    # The capacity depends on the request only (never on the number of drafts): attention
    # spans every slot, so plain and speculative decoding then compute bit-identical rows.
    cache = target.new_cache(T + max_new_tokens + MAX_TREE_SLACK)
    return DecodeState(cache=cache, tokens=input_ids, hidden=input_ids.new_empty(0), prompt_length=T,
                       max_new_tokens=max_new_tokens, eos=resolve_eos(target, eos_token_id), sampling=sampling,
                       generator=make_generator(sampling, target.device), hidden_layers=hidden_layers,
                       stats=DecodeStats.empty(num_draft_tokens, acceptance.label), acceptance=acceptance)


def finish_prefill(state: DecodeState, last: TargetStep) -> Round:
    """Once the whole prompt is in the cache: the features and logits of its last row (`last`,
    any forward whose final row is the prompt's last) give the drafter's state and the first
    new token (a `Round` of one, the target's own)."""
    state.hidden = last.hidden[:, -1]
    first = _emit(state, [_pick(last.logits[0, -1], state.sampling, state.generator)])
    state.stats.target_forwards += 1
    return first


@torch.no_grad()
def prefill(
    target: Target,
    input_ids: torch.Tensor,
    max_new_tokens: int = 128,
    hidden_layers: tuple[int, ...] = (-1,),
    sampling: SamplingConfig | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    num_draft_tokens: int = 0,
    acceptance: AcceptanceConfig | str | None = None,
) -> tuple[DecodeState, Round]:
    """Run the prompt once and pick the first new token. Returns the state and that token (a
    `Round` of one, the target's own). `acceptance`: the rule each `step` accepts drafts by
    (None: exact; a relaxed rule as `AcceptanceConfig` or its text, e.g. 'typical:0.09')."""
    t0 = time.perf_counter()
    state = open_state(target, input_ids, max_new_tokens, hidden_layers, sampling, eos_token_id, num_draft_tokens,
                       acceptance)
    out = target.forward(state.tokens, state.cache, hidden_layers, logits_to_keep=1)
    first = finish_prefill(state, out)
    state.stats.prefill_s = time.perf_counter() - t0
    return state, first


def round_k(state: DecodeState, drafter: Drafter | None, num_draft_tokens: int) -> int:
    """Drafts this round: never past max_new_tokens (the round always adds the target's own token too)."""
    _check_draft_count(num_draft_tokens)
    return min(num_draft_tokens if drafter is not None else 0, state.max_new_tokens - state.num_new - 1)


def prepare(drafter: Drafter | None, state: DecodeState, k: int, draft: Draft | None = None) -> Verify:
    """A round's draft (proposed here unless given) as the verify pass reads it: spine first,
    its tree layout, and the rows (the last committed token, then the drafts)."""
    if draft is None:
        if k > 0:
            draft = drafter.propose(DraftInput(state.tokens, state.hidden, state.cache, state.draft_memo), k, state.sampling,  # type: ignore[union-attr]
                                    state.generator)
        else:
            draft = Draft(tokens=state.tokens.new_empty(0))
    if draft.tokens.shape[0] > k:  # more rows than the round may verify (and the cache may hold)
        raise InputError(f"{type(drafter).__name__}.propose returned {draft.tokens.shape[0]} tokens, expected at most {k}.")
    draft = _spine_first(draft)  # a tree's likeliest path verifies on the cache itself, uncopied
    parents = draft.parent_list()
    # A tree's positions, masks and ancestor lists, derived here once for the forward (None: a chain)
    layout = None if draft.is_chain else TreeLayout.from_parents(parents)
    rows = torch.cat([state.tokens[:, -1:], draft.tokens.to(state.tokens)[None]], dim=1)  # (1, M)
    return Verify(draft=draft, parents=parents, layout=layout, rows=rows, start=state.cache.length, k=k)


@dataclass(frozen=True)
class Verify:
    """One round between drafting and acceptance: the draft, its parents and layout, the verify rows."""

    draft: Draft
    parents: list[int]
    layout: TreeLayout | None
    rows: torch.Tensor  # (1, M)
    start: int  # the cache's committed length before the verify pass
    k: int  # the drafts the round asked for


def conclude(state: DecodeState, drafter: Drafter | None, v: Verify, out: TargetStep, draft_s: float,
             verify_s: float, p: torch.Tensor | None = None) -> Round:
    """Accept the longest agreeing path plus the target's own next token; roll the cache back to
    that path; continue from the features of its last row, which the verify pass computed.
    `p`: the target's law over the verify rows, if already computed (sampling)."""
    path, nxt = accept(v.draft, out.logits[0], state.sampling, state.generator, state.acceptance, p,
                       out.choice)  # rows, root first
    state.cache.keep(v.start, path)
    state.hidden = out.hidden[:, path[-1]]  # (1, F)
    accepted = [int(t) for t in v.rows[0, path[1:]]] + [nxt]
    n = len(path) - 1
    if drafter is not None and v.k > 0:
        drafter.update(len(v.parents), n)
    s = state.stats
    s.draft_s += draft_s
    s.verify_s += verify_s
    s.target_forwards += 1
    s.record_round(len(v.parents) if v.layout is None else int(v.layout.depths.max()), n)  # a tree checks one node per depth
    return _emit(state, accepted, drafted=n)


@torch.no_grad()
def step(target: Target, drafter: Drafter | None, state: DecodeState, num_draft_tokens: int) -> Round:
    """One round: draft, verify in one target forward, accept, roll back. Returns what it
    emitted, already appended to `state`: the accepted drafts and the target's own token (at
    least one token; none once `state.done`)."""
    if state.done:
        return Round(tokens=(), drafted=())
    # 1. Draft k tokens (a chain, or a tree of k nodes); the drafter reads the cache, never writes it.
    t0 = time.perf_counter()
    v = prepare(drafter, state, round_k(state, drafter, num_draft_tokens))
    t1 = time.perf_counter()
    # 2. Verify: one target forward over the last committed token and the drafts.
    out = target.forward(v.rows, state.cache, state.hidden_layers, layout=v.layout)
    # 3.-5. Accept, roll back, continue.
    return conclude(state, drafter, v, out, t1 - t0, time.perf_counter() - t1)


@torch.no_grad()
def generate(
    target: Any,
    drafter: Drafter | None,
    input_ids: torch.Tensor,
    max_new_tokens: int = 128,
    num_draft_tokens: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    temperature: float | None = 0.0,
    top_k: int | None = 0,
    top_p: float | None = 1.0,
    seed: int | None = None,
    on_tokens: Callable[[Round], None] | None = None,
    tree: bool = False,
    acceptance: AcceptanceConfig | str | None = None,
) -> GenerateOutput:
    """Decode with the target, drafting `num_draft_tokens` per round with `drafter`.

    Greedy (temperature 0) output equals plain decoding (`num_draft_tokens=0`) token for token,
    in every dtype, and in fp32 equals `model.generate(do_sample=False)`; sampled output is
    distributed exactly as the target's with the same settings. `on_tokens` is called with
    each round (for streaming): a `Round`, its new token ids and which of them were accepted
    drafts. top_k / top_p None mean off, as in HF.
    `num_draft_tokens` None: the drafter's own k (a head's measured best). `tree=True` drafts a
    tree of `num_draft_tokens` nodes from an MTP head (greedy or sampled), the same tree as
    `mtpspec generate --tree` (`drafters.build_drafter`).
    `acceptance` None (or 'exact') keeps all of the above. A relaxed rule (`AcceptanceConfig`, or
    its text such as 'typical:0.09', 'topm:3,0.3', 'entropy:2') also accepts drafts the target
    finds plausible, for more tokens per forward: the output is then *not* the target's, and
    `stats.acceptance` says which rule made it (docs/relaxed-acceptance.md)."""
    t = target if isinstance(target, Target) else Target(target)
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    drafter, k = build_drafter(drafter, "tree" if tree else "chain", k=num_draft_tokens)
    _check_draft_count(k)
    k = k if drafter is not None else 0
    layers = drafter.hidden_layers if drafter is not None else (-1,)
    state, new = prefill(t, input_ids, max_new_tokens, layers, sampling, eos_token_id, k, acceptance)
    while True:
        if on_tokens and new:
            on_tokens(new)
        if state.done:
            break
        new = step(t, drafter, state, k)
    return GenerateOutput(sequences=state.tokens, stats=state.stats)


def _spine_first(draft: Draft) -> Draft:
    """The same draft, its spine first (`tree.spine_first`): tokens, parents and q rows
    permuted together. Acceptance then returns rows of this reordered draft, which is the one
    verified."""
    if draft.is_chain:
        return draft
    order, parents = spine_first(draft.parent_list())
    idx = torch.tensor(order, dtype=torch.long)
    return Draft(tokens=draft.tokens[idx.to(draft.tokens.device)], parents=torch.tensor(parents, dtype=torch.long),
                 q=None if draft.q is None else draft.q[idx.to(draft.q.device)])


def _check_draft_count(num_draft_tokens: int) -> None:
    """A verify pass of more rows than the kernels were checked for could round differently."""
    if not 0 <= num_draft_tokens < R_MAX:
        raise InputError(f"num_draft_tokens must be in 0..{R_MAX - 1} (a verify pass checked bit for bit on this "
                         f"machine holds at most {R_MAX} rows), got {num_draft_tokens}.")


def _check_input(input_ids: Any, t: Target) -> torch.Tensor:
    if not torch.is_tensor(input_ids) or input_ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise InputError("input_ids must be an integer torch tensor of shape (1, T).")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise InputError(f"input_ids must have shape (1, T) with T >= 1, got {tuple(input_ids.shape)}.")
    if input_ids.shape[0] != 1:
        raise InputError(
            f"mtpspec decodes one sequence at a time (batch size 1); got batch size {input_ids.shape[0]}. "
            "Call generate once per prompt."
        )
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= t.vocab_size:
        raise InputError(f"input_ids hold ids outside the target's vocabulary [0, {t.vocab_size}).")
    return input_ids.long().to(t.device)
