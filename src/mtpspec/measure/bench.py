"""`mtpspec bench`: every decoding method on the same prompts, in one process, measured alike.

Methods run interleaved prompt by prompt after a warm-up, with their order rotating from one
prompt to the next, so machine noise (another job, thermal throttling) hits all of them alike.
A method is a name and a `run(ids) -> RunOutput` function that also reports the target
forwards it ran (prefill included): HF's `generate` runs the model's decoder stack once per
forward, counted by a hook on it that never outlives the call; mtpspec's loop runs its own
`Target.forward` and counts its passes in `DecodeStats.target_forwards`. The bench test checks
that both counters read one forward per token for plain decoding.
Everything measured comes back as dataclasses; `report.py` writes them out.

Methods: `hf` (Hugging Face greedy `generate`, the reference output), `k0` (mtpspec's loop
without drafts), `mtp` and `mtp_k{k}` (mtpspec with the MTP head), `draft-model` (mtpspec's loop
with an independent draft model, a small standalone LM with its own embedding and KV cache,
`core/draft_model.py`: the same verify pass as `mtp`), `assisted` (HF assisted generation with
that draft model), `lookup` (HF prompt lookup decoding), `llamacpp` / `llamacpp-lookup`
(llama.cpp greedy / prompt lookup on the target's GGUF file, `llamacpp.py`), and `mtp-relaxed`:
the head's chain under a relaxed acceptance rule (`core/relaxed.py`), one method per rule in
`BenchConfig.acceptance`; its outputs are not the target's own, so the bench scores every output
(`quality.py`): the target's mean log-probability of it, its edit distance to k0's, and where the
prompts carry references, the category's reference metric.
Every run is also charged its process CPU seconds (`time.process_time`, all threads): with
target forwards per token, the energy proxy.
"""

from __future__ import annotations

import copy
import datetime
import platform
import resource
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..config import AcceptanceConfig
from ..core.decode import generate as mtp_generate
from ..core.draft_model import DraftModelDrafter
from ..core.drafters import (
    FALLBACK_K,
    FIXED_TREE,
    HYBRID_LOOKUP,
    SWITCH_TOKENS,
    TREE_NODES,
    TREE_SHAPE,
    RoundCosts,
    TreeConfig,
    build_drafter,
    head_round_costs,
    tree_config,
)
from ..core.stats import DecodeStats
from ..core.target import Target
from ..errors import InputError
from ..prompts import Prompt
from .quality import edit_distance

METHODS = ("hf", "k0", "mtp", "mtp-tree", "hybrid", "switch", "draft-model", "assisted", "lookup", "llamacpp",
           "llamacpp-lookup", "mtp-relaxed")
RELAXED = "mtp-relaxed"
# What runs when no --methods is given: every method but draft-model, which needs a draft model
# (the shipped baseline exists for the embedded target only), and mtp-relaxed, which is not exact.
DEFAULT_METHODS = tuple(m for m in METHODS if m not in ("draft-model", RELAXED))
HEAD_METHODS = ("mtp", "mtp-tree", "hybrid", "switch", RELAXED)
ALL = "all"  # the category name of the overall summary
FRESH_HEAD_NOTE = ("mtp: no trained head for this target, so a freshly initialised head was used; its acceptance is "
                   "near zero. Pass --head DIR.")


# -- configuration ----------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchConfig:
    # Methods to run, in this order for the first prompt (rotated for each next one).
    methods: tuple[str, ...] = DEFAULT_METHODS
    # Drafts per round (k) for `mtp`; None = the head's recommended k.
    num_draft_tokens: int | None = None
    # Drafts per round for `draft-model`; None = mtp's k (FALLBACK_K without a head), so that both
    # drafters propose equally long chains.
    draft_model_k: int | None = None
    # Extra `mtp_k{k}` methods, one per k.
    sweep: tuple[int, ...] = ()
    max_new_tokens: int = 128
    # Timed repetitions of every (prompt, method); the totals sum over them.
    reps: int = 1
    # Prompts run (untimed) by every method before timing starts.
    warmup: int = 1
    # Draft length of prompt lookup decoding (HF `prompt_lookup_num_tokens`).
    lookup_tokens: int = 10
    # Drafts per round of `llamacpp-lookup` (llama.cpp's `num_pred_tokens`): the best of 2 / 4 / 10
    # on a 2-core Zen 4 (74.0 / 61.3 / 45.4 tok/s against llama.cpp greedy 92.1; issue 46).
    llamacpp_lookup_k: int = 2
    # Draft nodes per round for `mtp-tree` and `hybrid` (a tree from the head).
    tree_nodes: int = TREE_NODES
    # How those trees are shaped: "cost" (each round from the measured costs and the head's
    # confidence, `drafters.RoundCosts`) or "fixed" (the N best nodes, `tree_floor`).
    tree_shape: str = "cost"
    # Deepest node of those trees (None = as deep as the nodes allow).
    tree_depth: int | None = TREE_SHAPE.max_depth
    # Fixed shape: least cumulative draft probability of a node off the head's greedy spine.
    tree_floor: float = FIXED_TREE.min_branch_prob
    # Most nodes of the prompt-lookup branch that `hybrid` puts beside the head's tree (at most
    # tree_nodes are drafted in all).
    hybrid_lookup: int = HYBRID_LOOKUP
    # Longest prompt-lookup chain of `switch` (its head rounds draft the head's k).
    switch_tokens: int = SWITCH_TOKENS
    # The relaxed rules `mtp-relaxed` runs, one method each (`AcceptanceConfig.parse` text). One
    # rule: a method named mtp-relaxed; several: mtp-relaxed:<rule>. Not in the default methods.
    # typical:0.4: the only setting that was faster than the exact head at the least cost (reports/relaxed/).
    acceptance: tuple[str, ...] = ("typical:0.4",)
    # Score every output (`quality.py`): the target's mean log-probability of it, its edit
    # distance to k0's and, where the prompts have references, the category's reference metric.
    quality: bool = True
    # Context lengths at which the drafter-owned memory is reported.
    contexts: tuple[int, ...] = (512, 2048, 8192)

    def __post_init__(self) -> None:
        object.__setattr__(self, "methods", tuple(self.methods))
        object.__setattr__(self, "sweep", tuple(int(k) for k in self.sweep))
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise InputError(f"Unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)} "
                             "(use --sweep for mtp_k<k>).")
        if not self.methods and not self.sweep:
            raise InputError("No methods to run: give --methods and/or --sweep.")
        if self.num_draft_tokens is not None and self.num_draft_tokens < 1:
            raise InputError(f"--num-draft-tokens must be >= 1 (k0 is plain decoding), got {self.num_draft_tokens}.")
        if self.draft_model_k is not None and self.draft_model_k < 1:
            raise InputError(f"--draft-model-k must be >= 1, got {self.draft_model_k}.")
        if any(k < 1 for k in self.sweep):
            raise InputError(f"--sweep values must be >= 1, got {list(self.sweep)}.")
        if self.max_new_tokens < 1 or self.reps < 1 or self.warmup < 0 or self.lookup_tokens < 1 or self.switch_tokens < 1:
            raise InputError("max_new_tokens, reps, lookup_tokens and switch_tokens must be >= 1, warmup >= 0.")
        if self.llamacpp_lookup_k < 1:
            raise InputError(f"--llamacpp-lookup-k must be >= 1, got {self.llamacpp_lookup_k}.")
        if self.tree_nodes < 1 or self.hybrid_lookup < 0:  # a lookup branch longer than the tree is cut to it
            raise InputError(f"--tree-nodes must be >= 1 and --hybrid-lookup >= 0, got {self.tree_nodes} and "
                             f"{self.hybrid_lookup}.")
        self.tree_config("torch")  # refuses a bad shape, depth or floor with its own message
        rules = [AcceptanceConfig.parse(a) for a in self.acceptance]  # a bad rule fails here, with its message
        object.__setattr__(self, "acceptance", tuple(r.label for r in rules))
        if RELAXED in self.methods and (not rules or any(r.exact for r in rules)):
            raise InputError("mtp-relaxed needs a relaxed rule in --acceptance (typical:EPS, topm:M,ALPHA or entropy:TAU); "
                             "the exact rule is the method `mtp`.")
        if len(set(rules)) != len(rules):
            raise InputError(f"--acceptance names a rule twice: {'; '.join(self.acceptance)}.")

    def tree_config(self, engine: str, costs: RoundCosts | None = None) -> TreeConfig:
        """The trees of mtp-tree and hybrid for a target running `engine` (`Target.engine`), a
        cost-shaped one priced by `costs` where given (`drafters.head_round_costs`)."""
        return tree_config(self.tree_shape, engine, self.tree_depth, self.tree_floor, costs)

    @property
    def needs_head(self) -> bool:
        return any(m in self.methods for m in HEAD_METHODS) or bool(self.sweep)

    def relaxed_methods(self) -> list[tuple[str, str]]:
        """(method name, rule label) of each `mtp-relaxed` method, when it is asked for."""
        if RELAXED not in self.methods:
            return []
        return [(RELAXED if len(self.acceptance) == 1 else f"{RELAXED}:{a}", a) for a in self.acceptance]

    @property
    def needs_gguf(self) -> bool:
        """Whether a method runs the target's GGUF file (llama.cpp's)."""
        return any(m.startswith("llamacpp") for m in self.methods)


# -- methods ----------------------------------------------------------------------------------
@dataclass
class RunOutput:
    tokens: list[int]  # the new tokens only
    seconds: float  # wall time of the whole call
    ttft: float | None  # seconds to the first new token, any draft model prefill included
    target_forwards: int  # forward passes of the target, prefill included
    stats: DecodeStats | None  # mtpspec's own loop only


@dataclass(frozen=True)
class DrafterMemory:
    """Bytes a method's drafter owns beside the target: parameters (and buffers) plus its own
    KV cache, which grows with the context."""

    param_bytes: int = 0
    kv_bytes_per_token: int = 0

    def at(self, context: int) -> int:
        return self.param_bytes + self.kv_bytes_per_token * context


@dataclass
class Method:
    name: str
    run: Callable[[torch.Tensor], RunOutput]
    memory: DrafterMemory = DrafterMemory()
    k: int | None = None  # drafts per round, for the MTP methods
    acceptance: str | None = None  # mtpspec's loop: its acceptance rule ("exact" or a relaxed rule's label)


class _FirstTokenClock:
    """An HF `generate` streamer that notes when the first new token arrives (the first `put`
    carries the prompt). Duck-typed: `generate` only calls `put` and `end`."""

    def __init__(self) -> None:
        self.puts = 0
        self.first: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def hf_method(name: str, model: Any, max_new_tokens: int, **generate_kw: Any) -> Method:
    """A method that calls HF `model.generate` greedily, with extra keyword arguments
    (`assistant_model`, `prompt_lookup_num_tokens`)."""
    gc = model.generation_config
    eos = gc.eos_token_id
    pad = gc.pad_token_id if gc.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)
    if pad is not None:
        generate_kw["pad_token_id"] = pad

    def run(ids: torch.Tensor) -> RunOutput:
        clock = _FirstTokenClock()
        with count_forwards(model) as forwards:
            t0 = time.perf_counter()
            out = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens, attention_mask=torch.ones_like(ids),
                                 streamer=clock, **generate_kw)
            seconds = time.perf_counter() - t0
        ttft = clock.first - t0 if clock.first is not None else None
        return RunOutput(out[0, ids.shape[1]:].tolist(), seconds, ttft, forwards[0], None)

    return Method(name, run)


def mtpspec_method(name: str, target: Target, head: Any, k: int, max_new_tokens: int, drafter: Any = None,
                   memory: DrafterMemory | None = None, acceptance: str = "exact") -> Method:
    """mtpspec's loop drafting k tokens per round with `head` (k=0 or head=None: no drafts), or
    with another drafter built on it (a tree, a hybrid), or with a draft model (`drafter`, its
    `memory` given), which reads the prompt first: its prefill counts in TTFT. `acceptance`: the
    rule (exact unless a relaxed one is named)."""
    drafter = drafter if drafter is not None else head

    def run(ids: torch.Tensor) -> RunOutput:
        first: list[float] = []

        def on_tokens(new: list[int]) -> None:
            if not first:
                first.append(time.perf_counter())

        t0 = time.perf_counter()
        if isinstance(drafter, DraftModelDrafter):
            drafter.prefill(ids)
        out = mtp_generate(target, drafter, ids, max_new_tokens=max_new_tokens, num_draft_tokens=k, on_tokens=on_tokens,
                           acceptance=acceptance)
        seconds = time.perf_counter() - t0
        return RunOutput(out.sequences[0, ids.shape[1]:].tolist(), seconds, first[0] - t0 if first else None,
                         out.stats.target_forwards, out.stats)

    if memory is None:
        memory = DrafterMemory(param_bytes=head.inference_bytes()) if head is not None and k else DrafterMemory()
    return Method(name, run, memory, k, acceptance)


def draft_model_memory(model: Any) -> DrafterMemory:
    """A draft model owns its weights and a KV cache of its own:
    2 (K and V) * layers * kv_heads * head_dim * element size bytes per cached position."""
    c = model.config
    heads = int(c.num_attention_heads)
    kv_heads = int(getattr(c, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // heads)
    tensors = list(model.parameters()) + list(model.buffers())
    elem = next(iter(model.parameters())).element_size()
    return DrafterMemory(param_bytes=sum(t.numel() * t.element_size() for t in tensors),
                         kv_bytes_per_token=2 * int(c.num_hidden_layers) * kv_heads * head_dim * elem)


TRAIN_DRAFT_MODEL = ("Train one with `mtpspec train --kind draft-model --data DATA --out RUN` (its model lands in "
                     "RUN/draft_model; reports/seed-comparison/train-baseline.sh is the shipped baseline's recipe) and "
                     "pass --draft-model RUN/draft_model.")


def load_draft_model(path: str | Path, dtype: torch.dtype) -> Any:
    """A draft model saved with `save_pretrained` (e.g. <run>/draft_model), local files only."""
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise InputError(f"Draft model {p} is not a saved Hugging Face model directory (no config.json). "
                         + TRAIN_DRAFT_MODEL)
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype, local_files_only=True).eval()
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"Could not load the draft model from {p}: {e}") from e


def build_methods(cfg: BenchConfig, model: Any, head: Any = None, draft_model: Any = None,
                  hf_model: Any = None, gguf: Path | None = None) -> tuple[list[Method], list[str]]:
    """The methods `cfg` asks for, plus notes on any that had to be skipped. mtpspec's methods
    run `model`; HF's own (hf, lookup, assisted) run `hf_model` if given (e.g. fp32, HF's
    default, beside a bf16 `model`), else `model`; llama.cpp runs `gguf`, the target's file."""
    target = head.target if head is not None else Target(model)
    hf_model = hf_model if hf_model is not None else model
    notes: list[str] = []
    if cfg.needs_head and head is None:
        raise InputError("The mtp methods need an MTP head: pass one, or leave mtp out of --methods and --sweep.")
    k = build_drafter(head, "chain", k=cfg.num_draft_tokens)[1]
    draft_k = cfg.draft_model_k or (k if head is not None else FALLBACK_K)
    methods = []
    for name in cfg.methods:
        if name == "hf":
            methods.append(hf_method("hf", hf_model, cfg.max_new_tokens))
        elif name == "k0":
            methods.append(mtpspec_method("k0", target, None, 0, cfg.max_new_tokens))
        elif name == "mtp":
            methods.append(mtpspec_method("mtp", target, head, k, cfg.max_new_tokens))
        elif name in ("mtp-tree", "hybrid"):
            drafter, n = build_drafter(head, name.removeprefix("mtp-"), k=cfg.tree_nodes,
                                       tree=cfg.tree_config(target.engine, head_round_costs(head)),
                                       lookup_tokens=cfg.hybrid_lookup)
            methods.append(mtpspec_method(name, target, head, n, cfg.max_new_tokens, drafter))
        elif name == RELAXED:
            methods += [mtpspec_method(m, target, head, k, cfg.max_new_tokens, acceptance=a) for m, a in cfg.relaxed_methods()]
        elif name == "switch":
            drafter, n = build_drafter(head, "switch", k=cfg.switch_tokens, head_k=k)
            methods.append(mtpspec_method("switch", target, head, n, cfg.max_new_tokens, drafter))
        elif name == "draft-model":
            if draft_model is None:
                raise InputError("The draft-model method needs a draft model and none was given or shipped for this "
                                 "target. " + TRAIN_DRAFT_MODEL)
            # its own copy in the target's dtype (assisted moves the given one to HF's dtype in place)
            lm = copy.deepcopy(draft_model).to(target.dtype)
            methods.append(mtpspec_method(name, target, None, draft_k, cfg.max_new_tokens,
                                          DraftModelDrafter(lm, target), draft_model_memory(lm)))
        elif name == "lookup":
            methods.append(hf_method("lookup", hf_model, cfg.max_new_tokens, prompt_lookup_num_tokens=cfg.lookup_tokens))
        elif name.startswith("llamacpp"):
            from . import llamacpp

            eos = model.generation_config.eos_token_id
            eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
            method, note = llamacpp.bench_method(name, gguf, eos, cfg.max_new_tokens, torch.get_num_threads(),
                                                 cfg.llamacpp_lookup_k)
            methods.extend([method] if method is not None else [])
            notes.extend([note] if note is not None else [])
        elif name == "assisted":
            if draft_model is None:
                notes.append("assisted: skipped, no draft model given (pass --draft-model DIR, a model saved "
                             "by `mtpspec train --kind draft-model` in <run>/draft_model).")
                continue
            if draft_model.config.vocab_size != target.vocab_size:
                raise InputError(f"The draft model's vocabulary ({draft_model.config.vocab_size}) differs from the "
                                 f"target's ({target.vocab_size}); assisted generation needs a shared tokenizer.")
            m = hf_method("assisted", hf_model, cfg.max_new_tokens, assistant_model=draft_model.to(hf_model.dtype))
            methods.append(Method(m.name, m.run, draft_model_memory(draft_model)))
    for kk in cfg.sweep:
        methods.append(mtpspec_method(f"mtp_k{kk}", target, head, kk, cfg.max_new_tokens))
    return methods, notes


# -- measuring --------------------------------------------------------------------------------
@contextmanager
def count_forwards(model: Any) -> Iterator[list[int]]:
    """Count forward passes of a Hugging Face model's decoder stack (`model.model`, which HF
    `generate` runs once per pass, the draft model's own stack aside) while the block runs; the
    hook never outlives it."""
    count = [0]
    base = getattr(model, "model", model)
    handle = base.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    try:
        yield count
    finally:
        handle.remove()


@dataclass
class Record:
    """One timed run of one method on one prompt."""

    method: str
    question_id: Any
    category: str
    rep: int
    new_tokens: int
    seconds: float
    ttft: float | None
    target_forwards: int  # prefill included (see RunOutput)
    stats: DecodeStats | None  # mtpspec's own loop only: acceptance histogram, per-position counts
    cpu_seconds: float = 0.0  # process CPU time of the run, every thread (time.process_time)
    identical: bool | None = None  # output equals hf's (first rep) token for token; None: hf not run
    first_diff: int | None = None  # index of the first token that differs from hf's output
    identical_k0: bool | None = None  # output equals mtpspec's plain decoding (k0), the exactness guarantee
    identical_llamacpp: bool | None = None  # output equals llama.cpp's own greedy (`llamacpp`, first rep)
    edit_k0: int | None = None  # token edit distance to k0's output (first rep)
    # `quality.QualityScorer`'s scores: "logprob" (the target's mean log-probability of the
    # output, nats per token) and the category's reference metric where the prompt has one
    quality: dict[str, float] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list, repr=False)

    @property
    def acceptance(self) -> str | None:
        """The rule mtpspec's loop decoded this under (None: another library's method)."""
        return self.stats.acceptance if self.stats is not None else None


@dataclass
class Summary:
    """One method over one category (or ALL)."""

    method: str
    category: str
    prompts: int
    new_tokens: int
    seconds: float
    tokens_per_s: float
    speedup_vs_hf: float | None
    speedup_vs_k0: float | None
    mean_accepted: float | None  # tokens per target forward that verifies drafts
    forwards_per_token: float  # target forwards (prefill included) per new token
    ttft_s: float | None  # mean time to first token
    identical: int | None  # prompts whose output equals hf's in every rep (None: hf not run)
    position_acceptance: list[float] | None  # rate at which draft position i was accepted
    identical_k0: int | None = None  # prompts whose output equals k0's in every rep (None: k0 not run)
    identical_llamacpp: int | None = None  # prompts whose output equals llamacpp's in every rep (None: not run)
    ms_per_forward: float | None = None  # mtpspec's loop: mean wall time of one target forward that verifies (drafting excluded)
    ms_per_draft: float | None = None  # mtpspec's loop: mean drafting time per round
    acceptance: str | None = None  # mtpspec's loop: "exact", or the relaxed rule that made these outputs
    changed_k0: float | None = None  # share of prompts whose output differs from k0's in some rep
    edit_k0: float | None = None  # mean token edit distance to k0's output
    # mean of each quality score over the records that have it ("logprob", "rougeL", "chrF",
    # "answer", "contains": `quality.py`), and how many records that was ("n_rougeL", ...)
    quality: dict[str, float] = field(default_factory=dict)
    cpu_s_per_token: float | None = None  # process CPU seconds per new token (with forwards_per_token: the energy proxy)


@dataclass
class BenchResult:
    config: BenchConfig
    info: dict[str, Any]  # target, dtype, head, draft model, versions, threads (see `environment_info`)
    methods: list[str]
    categories: list[str]
    records: list[Record]
    summaries: list[Summary]
    memory: dict[str, DrafterMemory]
    method_k: dict[str, int | None]
    method_acceptance: dict[str, str | None]
    notes: list[str]
    peak_rss_bytes: int
    best_k: int | None  # the k of the fastest MTP chain method overall

    def summary(self, method: str, category: str = ALL) -> Summary:
        return next(s for s in self.summaries if s.method == method and s.category == category)

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "info": self.info,
            "methods": self.methods,
            "categories": self.categories,
            "notes": self.notes,
            "peak_rss_bytes": self.peak_rss_bytes,
            "best_k": self.best_k,
            "method_k": self.method_k,
            "method_acceptance": self.method_acceptance,
            "memory": {m: {"param_bytes": mem.param_bytes, "kv_bytes_per_token": mem.kv_bytes_per_token,
                           "bytes_at_context": {str(c): mem.at(c) for c in self.config.contexts}}
                       for m, mem in self.memory.items()},
            "summaries": [asdict(s) for s in self.summaries],
            "records": [_record_dict(r) for r in self.records],
        }


def _record_dict(r: Record) -> dict[str, Any]:
    """One record for results.json: its stats as `DecodeStats.to_dict` writes them (mean accepted,
    acceptance histogram, per-position rates), its tokens left out."""
    d = {f: getattr(r, f) for f in ("method", "question_id", "category", "rep", "new_tokens", "seconds", "ttft",
                                    "target_forwards", "identical", "first_diff", "identical_k0", "identical_llamacpp", "cpu_seconds",
                                    "acceptance", "edit_k0", "quality")}
    d["stats"] = r.stats.to_dict() if r.stats is not None else None
    return d


def environment_info(cfg: BenchConfig, target_name: str, dtype: str, prompts_file: str | Path | None = None,
                     head_source: str = "-", draft_model: Any = None, draft_model_dir: str | Path | None = None,
                     now: datetime.datetime | None = None) -> dict[str, Any]:
    """What a report needs to be reproduced: date, target, dtype, threads, library versions, CPU,
    prompts, head, draft model, and the HF settings `assisted` and `lookup` run with."""
    import transformers

    now = now or datetime.datetime.now()
    info: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"), "target": target_name, "dtype": dtype,
        "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
        "cpu": platform.processor() or platform.machine(), "prompts_file": str(prompts_file or "built-in default"),
        "head": head_source, "draft_model": str(draft_model_dir) if draft_model is not None else "-",
    }
    if draft_model is not None and "assisted" in cfg.methods:
        gc = draft_model.generation_config  # None = the value transformers fills in at generate time
        names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
        vals = {n: getattr(gc, n, None) for n in names}
        info["assistant"] = ", ".join(f"{n}={'HF default' if v is None else v}" for n, v in vals.items())
    if "lookup" in cfg.methods:
        info["lookup"] = f"prompt_lookup_num_tokens={cfg.lookup_tokens}"
    if "llamacpp-lookup" in cfg.methods:
        info["llamacpp-lookup"] = f"LlamaPromptLookupDecoding(num_pred_tokens={cfg.llamacpp_lookup_k}, max_ngram_size=2)"
    return info


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (ru_maxrss is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def run_bench(cfg: BenchConfig, methods: Sequence[Method], prompts: Sequence[Prompt], inputs: Sequence[torch.Tensor],
              info: dict[str, Any] | None = None, notes: Sequence[str] = (), progress: bool = True,
              scorer: Callable[[Prompt, torch.Tensor, list[int]], dict[str, float]] | None = None) -> BenchResult:
    """Run every method on every prompt (`inputs[i]` holds prompt i's (1, T) ids); then, untimed,
    score every output with `scorer` (`quality.QualityScorer`), if given."""
    if not methods:
        raise InputError("No method left to run (see the notes on skipped methods).")
    n = len(methods)
    bar = tqdm(total=n * (min(cfg.warmup, len(inputs)) + len(inputs) * cfg.reps), desc="bench", disable=not progress)
    bar.set_postfix_str("warm-up")
    for ids in inputs[: cfg.warmup]:
        for m in methods:
            m.run(ids)
            bar.update()
    bar.set_postfix_str("")

    records = []
    for i, (p, ids) in enumerate(zip(prompts, inputs)):
        for rep in range(cfg.reps):
            j = (i * cfg.reps + rep) % n  # rotate the order: no method always runs right after another
            for m in list(methods[j:]) + list(methods[:j]):
                cpu = time.process_time()
                out = m.run(ids)
                cpu = time.process_time() - cpu
                records.append(Record(m.name, p.question_id, p.category, rep, len(out.tokens), out.seconds, out.ttft,
                                      out.target_forwards, out.stats, cpu_seconds=cpu, tokens=out.tokens))
                bar.update()
    bar.close()
    if scorer is not None:
        by_id = {p.question_id: (p, ids) for p, ids in zip(prompts, inputs)}
        for r in tqdm(records, desc="quality", disable=not progress):
            r.quality = scorer(*by_id[r.question_id], r.tokens)

    names = [m.name for m in methods]
    _compare_outputs(records)
    categories = list(dict.fromkeys(p.category for p in prompts))
    summaries = [summarize(records, name, cat) for cat in [ALL, *categories] for name in names]
    _add_speedups(summaries)
    method_k = {m.name: m.k for m in methods}
    method_acceptance = {m.name: m.acceptance for m in methods}
    chains = [n for n in names if n == "mtp" or n.startswith("mtp_k")]  # trees count nodes, not a draft length
    timed = [(s.tokens_per_s, method_k[s.method]) for s in summaries if s.category == ALL and s.method in chains]
    return BenchResult(config=cfg, info=dict(info or {}), methods=names, categories=categories, records=records,
                       summaries=summaries, memory={m.name: m.memory for m in methods}, method_k=method_k,
                       method_acceptance=method_acceptance, notes=list(notes), peak_rss_bytes=peak_rss_bytes(),
                       best_k=max(timed)[1] if timed else None)


def _compare_outputs(records: list[Record]) -> None:
    """Compare every record's tokens with hf's, k0's and llamacpp's first-rep output for the same prompt."""
    ref = {r.question_id: r.tokens for r in records if r.method == "hf" and r.rep == 0}
    plain = {r.question_id: r.tokens for r in records if r.method == "k0" and r.rep == 0}
    llama = {r.question_id: r.tokens for r in records if r.method == "llamacpp" and r.rep == 0}
    for r in records:
        if r.question_id in plain:
            r.identical_k0 = r.tokens == plain[r.question_id]
            r.edit_k0 = edit_distance(r.tokens, plain[r.question_id])
        if r.question_id in llama:
            r.identical_llamacpp = r.tokens == llama[r.question_id]
        if r.question_id not in ref:
            continue
        a, b = r.tokens, ref[r.question_id]
        r.identical = a == b
        if not r.identical:
            r.first_diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def summarize(records: Sequence[Record], method: str, category: str = ALL) -> Summary:
    rs = [r for r in records if r.method == method and category in (ALL, r.category)]
    tokens = sum(r.new_tokens for r in rs)
    seconds = sum(r.seconds for r in rs)
    forwards = sum(r.target_forwards for r in rs)
    cpu = sum(r.cpu_seconds for r in rs)
    ttfts = [r.ttft for r in rs if r.ttft is not None]
    ms_forward = ms_draft = None
    if rs and all(r.stats is not None for r in rs):  # mtpspec's loop: prefill excluded, from DecodeStats
        merged = DecodeStats.merge(r.stats for r in rs if r.stats is not None)
        mean_accepted: float | None = merged.mean_accepted
        positions = merged.position_acceptance or None
        if merged.rounds:
            ms_forward = 1e3 * merged.verify_s / merged.rounds
            ms_draft = 1e3 * merged.draft_s / merged.rounds
    else:  # HF: every target forward verifies drafts (assisted/lookup verify with the prompt too)
        mean_accepted, positions = (tokens / forwards if forwards else None), None
    compared = [r for r in rs if r.identical is not None]
    qids = {r.question_id for r in compared}
    identical = sum(all(r.identical for r in compared if r.question_id == q) for q in qids) if compared else None
    vs_k0 = [r for r in rs if r.identical_k0 is not None]
    k0_qids = {r.question_id for r in vs_k0}
    identical_k0 = sum(all(r.identical_k0 for r in vs_k0 if r.question_id == q) for q in k0_qids) if vs_k0 else None
    vs_llama = [r for r in rs if r.identical_llamacpp is not None]
    identical_llamacpp = sum(all(r.identical_llamacpp for r in vs_llama if r.question_id == q)
                             for q in {r.question_id for r in vs_llama}) if vs_llama else None
    quality: dict[str, float] = {}
    for name in dict.fromkeys(q for r in rs for q in r.quality):
        values = [r.quality[name] for r in rs if name in r.quality]
        quality[name], quality[f"n_{name}"] = sum(values) / len(values), len(values)
    edits = [r.edit_k0 for r in rs if r.edit_k0 is not None]
    rules = {r.acceptance for r in rs}
    return Summary(method=method, category=category, prompts=len({r.question_id for r in rs}), new_tokens=tokens,
                   seconds=seconds, tokens_per_s=tokens / seconds if seconds else 0.0, speedup_vs_hf=None,
                   speedup_vs_k0=None, mean_accepted=mean_accepted,
                   forwards_per_token=forwards / tokens if tokens else 0.0,
                   ttft_s=sum(ttfts) / len(ttfts) if ttfts else None, identical=identical,
                   position_acceptance=positions, identical_k0=identical_k0, identical_llamacpp=identical_llamacpp,
                   ms_per_forward=ms_forward,
                   ms_per_draft=ms_draft, acceptance=rules.pop() if len(rules) == 1 else None,
                   changed_k0=1.0 - identical_k0 / len(k0_qids) if identical_k0 is not None and k0_qids else None,
                   edit_k0=sum(edits) / len(edits) if edits else None, quality=quality,
                   cpu_s_per_token=cpu / tokens if tokens else None)


def _add_speedups(summaries: list[Summary]) -> None:
    """Speed-ups are ratios of tokens/s measured in the same run, per category."""
    base = {(s.method, s.category): s.tokens_per_s for s in summaries}
    for s in summaries:
        hf, k0 = base.get(("hf", s.category)), base.get(("k0", s.category))
        s.speedup_vs_hf = s.tokens_per_s / hf if hf else None
        s.speedup_vs_k0 = s.tokens_per_s / k0 if k0 else None
