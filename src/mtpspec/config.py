"""Frozen configs. Each field has a default that works for any supported target; validation
lives in ``__post_init__`` so a bad value fails where it is written, not deep in a forward."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from .errors import InputError


@dataclass(frozen=True)
class HeadConfig:
    # Which target hidden states feed the head at the last verified position. Negative
    # indices count from the end of `output_hidden_states` (-1 = the final, normed output).
    # More than one layer adds a linear fuse from len(layers) * D to D.
    hidden_layers: tuple[int, ...] = (-1,)
    # The target layer whose cached keys/values the head cross-attends to. The last layer's
    # keys are the most "semantic" and are already in the cache: zero copy, zero prefill.
    kv_layer: int = -1
    # Number of small blocks (cross-attention + MLP). One keeps a draft step cheap.
    num_blocks: int = 1
    # MLP width of each block as a multiple of the target's hidden size (0 = no MLP).
    mlp_ratio: float = 2.0
    # If > 0, the head scores only this many target tokens (the most frequent in the
    # training data); drafts map back to target ids. 0 = the full vocabulary.
    draft_vocab_size: int = 0
    # Draft steps the head was unrolled for in training: `train` records TrainConfig's
    # max_draft_tokens here (None = never trained). A record, not a setting or a limit: the
    # block is shared across steps, so a head drafts as many tokens per round as decoding asks.
    trained_draft_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.hidden_layers:
            raise InputError("HeadConfig.hidden_layers must name at least one layer, e.g. (-1,).")
        object.__setattr__(self, "hidden_layers", tuple(int(i) for i in self.hidden_layers))
        if self.num_blocks < 1:
            raise InputError(f"HeadConfig.num_blocks must be >= 1, got {self.num_blocks}.")
        if self.mlp_ratio < 0:
            raise InputError(f"HeadConfig.mlp_ratio must be >= 0, got {self.mlp_ratio}.")
        if self.draft_vocab_size < 0:
            raise InputError("HeadConfig.draft_vocab_size must be >= 0 (0 = full vocabulary).")
        if self.trained_draft_tokens is not None and self.trained_draft_tokens < 1:
            raise InputError("HeadConfig.trained_draft_tokens must be >= 1 (or None: untrained).")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hidden_layers"] = list(self.hidden_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HeadConfig:
        d = dict(d)
        if "max_draft_tokens" in d:  # the record's name in heads saved before it was renamed
            d["trained_draft_tokens"] = d.pop("max_draft_tokens")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise InputError(f"Unknown HeadConfig fields {sorted(unknown)}; known: {sorted(known)}.")
        return cls(**{k: (tuple(v) if k == "hidden_layers" else v) for k, v in d.items()})


@dataclass(frozen=True)
class SamplingConfig:
    # 0 = greedy (argmax), as Hugging Face `do_sample=False`. None is read as 0.
    temperature: float = 0.0
    # Keep only the k most likely tokens (0 = off). Applied after temperature. None (Hugging
    # Face's way to say off) is read as 0.
    top_k: int = 0
    # Keep the smallest set of tokens whose probability reaches top_p (1.0 = off). After top_k.
    # None is read as 1.0.
    top_p: float = 1.0
    # Seed of the explicit torch.Generator used for sampling; None = nondeterministic.
    seed: int | None = None

    def __post_init__(self) -> None:
        # A generation config copied from Hugging Face says "off" with None: store the value
        # that means off here, so that no later reader has to handle None.
        for name, off in (("temperature", 0.0), ("top_k", 0), ("top_p", 1.0)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, off)
        if self.temperature < 0:
            raise InputError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}.")
        if self.top_k < 0:
            raise InputError(f"top_k must be >= 0 (0 = off), got {self.top_k}.")
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# The acceptance rules: `exact` (the default, and the product's promise) and three relaxed ones
# (`core/relaxed.py`), each with its parameters in this order on the command line.
ACCEPTANCE_PARAMS = {"exact": (), "typical": ("eps", "delta"), "topm": ("m", "alpha"), "entropy": ("tau", "m")}


@dataclass(frozen=True)
class AcceptanceConfig:
    """Which drafts a round accepts. `exact` keeps the target's own output (greedy: token for
    token; sampling: in distribution). A relaxed rule also accepts a draft the target finds
    plausible enough, so its output is *not* the target's; it never is the default.
    A relaxed rule accepts whatever the exact rule accepts, and more: see `core/relaxed.py`."""

    # exact, typical, topm or entropy.
    rule: str = "exact"
    # typical (Medusa, Cai et al. 2024): accept x when p(x) > min(eps, delta * exp(-H(p))).
    # None: 0.09, Medusa's posterior_threshold. Larger is stricter.
    eps: float | None = None
    # typical: the entropy term's factor. None: sqrt(eps), Medusa's pairing (0.3 for 0.09).
    # eps = 1 with delta = inf (a bar of 1) accepts nothing more than `exact`.
    delta: float | None = None
    # topm and entropy: x must be among the target's m most likely tokens. None: 3 (topm), 2
    # (entropy). m = 0 accepts nothing more than `exact`; m = 1 only the target's own choice,
    # which greedy `exact` accepts anyway (sampling does not always).
    m: int | None = None
    # topm: and p(x) >= alpha * p_max. None: 0.3. Smaller is looser.
    alpha: float | None = None
    # entropy: relax only where the target is unsure, H(p) >= tau nats. None: 2.0. tau = inf
    # accepts nothing more than `exact`.
    tau: float | None = None

    def __post_init__(self) -> None:
        if self.rule not in ACCEPTANCE_PARAMS:
            raise InputError(f"acceptance rule must be one of {', '.join(ACCEPTANCE_PARAMS)}, got {self.rule!r}.")
        names = ACCEPTANCE_PARAMS[self.rule]
        given = [f for f in ("eps", "delta", "m", "alpha", "tau") if getattr(self, f) is not None]
        stray = [f for f in given if f not in names]
        if stray:
            takes = f"takes {' and '.join(names)}" if names else "takes no parameter"
            raise InputError(f"acceptance rule {self.rule!r} {takes}, not {', '.join(stray)}.")
        defaults = {"eps": 0.09, "alpha": 0.3, "tau": 2.0, "m": 3 if self.rule == "topm" else 2}
        for f in names:
            if getattr(self, f) is None and f in defaults:
                object.__setattr__(self, f, defaults[f])
        if self.rule == "typical":
            if not 0.0 < self.eps <= 1.0:  # type: ignore[operator]
                raise InputError(f"typical acceptance needs 0 < eps <= 1, got {self.eps}.")
            if self.delta is None:
                object.__setattr__(self, "delta", math.sqrt(self.eps))  # type: ignore[arg-type]
            if not self.delta >= 0.0:  # type: ignore[operator]
                raise InputError(f"typical acceptance needs delta >= 0, got {self.delta}.")
        if self.m is not None and (isinstance(self.m, bool) or not float(self.m).is_integer() or self.m < 0):
            raise InputError(f"acceptance rule {self.rule!r} needs a whole m >= 0 (0: never relax), got {self.m}.")
        if self.m is not None:
            object.__setattr__(self, "m", int(self.m))
        if self.alpha is not None and not 0.0 <= self.alpha <= 1.0:
            raise InputError(f"topm acceptance needs 0 <= alpha <= 1, got {self.alpha}.")
        if self.tau is not None and not self.tau >= 0.0:
            raise InputError(f"entropy acceptance needs tau >= 0 nats (inf: never relax), got {self.tau}.")

    @property
    def exact(self) -> bool:
        return self.rule == "exact"

    @property
    def label(self) -> str:
        """The rule and its parameters as `parse` reads them back: 'exact', 'typical:0.09', 'topm:3,0.3'."""
        if self.exact:
            return "exact"
        names = ACCEPTANCE_PARAMS[self.rule]
        if self.rule == "typical" and self.delta == math.sqrt(self.eps):  # type: ignore[arg-type]
            names = ("eps",)  # Medusa's pairing, which parse restores
        return f"{self.rule}:" + ",".join(f"{getattr(self, f):g}" for f in names)

    @classmethod
    def parse(cls, text: str | AcceptanceConfig | None) -> AcceptanceConfig:
        """'typical:0.09', 'typical:0.09,0.3', 'topm:3,0.3', 'topm:alpha=0.5', 'entropy:2', 'exact'
        (None: exact) -> the config. Positional values follow ACCEPTANCE_PARAMS' order."""
        if text is None:
            return cls()
        if isinstance(text, AcceptanceConfig):
            return text
        rule, _, rest = str(text).strip().partition(":")
        names = ACCEPTANCE_PARAMS.get(rule.strip())
        if names is None:
            raise InputError(f"acceptance rule must be one of {', '.join(ACCEPTANCE_PARAMS)}, got {text!r} "
                             "(e.g. typical:0.09, topm:3,0.3, entropy:2).")
        values: dict[str, float] = {}
        items = [x.strip() for x in rest.split(",") if x.strip()]
        if len(items) > len(names):
            raise InputError(f"acceptance {text!r}: {rule} takes at most {len(names)} value(s) ({', '.join(names) or 'none'}).")
        for i, item in enumerate(items):
            name, eq, value = item.partition("=")
            name, value = (name.strip(), value) if eq else (names[i], item)
            if name not in names:
                raise InputError(f"acceptance {text!r}: {rule} has no parameter {name!r} (it takes {', '.join(names)}).")
            try:
                values[name] = float(value)
            except ValueError:
                raise InputError(f"acceptance {text!r}: {name} must be a number, got {value!r}.") from None
        return cls(rule=rule.strip(), **values)  # type: ignore[arg-type]


# What `mtpspec train --kind` can train.
TRAIN_KINDS = ("mtp", "draft-model", "gemma4-assistant")
# How `mtpspec train --kind draft-model` starts its model (TrainConfig.draft_model_init).
DRAFT_MODEL_INITS = ("random", "target")


@dataclass(frozen=True)
class TrainConfig:
    # What to train: "mtp" (the head), "draft-model" (a small standalone draft LM with its own
    # embedding and KV cache: the baseline `mtpspec bench` runs as HF assisted generation), or
    # "gemma4-assistant" (a Gemma 4 target's drafter in Google's assistant layout, which HF,
    # vLLM, SGLang and llama.cpp serve: `training/assistant.py`).
    kind: str = "mtp"
    # Draft steps unrolled per position (the head's recurrence, exactly as at decode time), saved
    # as HeadConfig.trained_draft_tokens. The block is shared across steps, so a head drafts more
    # steps than it was unrolled for; a step's cost grows with the unroll, and at equal time 2
    # learned far more than 6 (reports/training/train-rows/).
    max_draft_tokens: int = 2
    # Passes over the training split; a small set gets more (see `min_steps`).
    epochs: int = 2
    # At least this many optimizer steps, whatever the set's size: a set too small for them in
    # `epochs` passes is passed over more times (`plan`). Two passes over a 400-sample set are
    # only ~50 steps, too few for a fresh head to learn anything. 0 = exactly `epochs` passes.
    min_steps: int = 400
    # Sequences per optimizer step (global, summed over DDP ranks).
    batch_size: int = 16
    # A batch runs in parts of at most this many (padded) tokens, gradients accumulated: the
    # unrolled head's logits take K x V' floats per token (0 = the whole batch at once).
    micro_batch_tokens: int = 4096
    # Peak learning rate of AdamW, reached at the end of the warm-up, then cosine to 10% of it.
    lr: float = 1e-3
    # Linear warm-up: `warmup_fraction` of the run's steps, at most `warmup_steps`, so a short
    # run is not spent inside its warm-up (`plan`). Long runs (>= 1,000 steps) warm up for 50.
    warmup_steps: int = 50
    warmup_fraction: float = 0.05
    weight_decay: float = 0.0
    # Gradient-norm clipping threshold.
    clip: float = 1.0
    # bf16 autocast for the head's forward/backward (fast on CPUs with avx512_bf16; `mtpspec train`
    # turns it on only there, see `models.auto_autocast`).
    bf16: bool = True
    # Fraction of samples held out to report acceptance during training.
    holdout: float = 0.05
    # Report held-out acceptance and write a checkpoint every N optimizer steps.
    eval_every: int = 50
    save_every: int = 50
    # Weight of the hard-label cross-entropy added to the distillation loss.
    label_weight: float = 0.1
    # Weight of the feature loss (EAGLE): smooth-L1 between the head's normed state and the
    # target's own final hidden state at the same position - dense supervision per row. Used
    # when the head reads the final layer (hidden_layers ending in -1).
    feature_weight: float = 1.0
    # Weight of a total-variation term between the teacher's and the head's distributions
    # (1 - TV is the speculative-sampling acceptance probability), added to the KL-style loss.
    tv_weight: float = 0.0
    # Extra loss weight on the rows where greedy decoding would start a round (the head's own
    # teacher-forced drafts walked as `round_roots` walks them): 0 = every row alike. Rounds
    # start right after a rejection, where the head does worst, and only those rows' drafts
    # are ever verified (reports/acceptance/transfer/).
    round_weight: float = 0.0
    # Score each row's context tokens outside the reduced draft vocabulary too, as drafting does
    # (`MTPHead.copy_context`): the tokens of the prompt and answer up to the round's root join
    # that row's vocabulary. Without it, training never scores a copied rare word (and teaches
    # the head the teacher's best in-vocabulary token there instead).
    copy_context: bool = False
    # Weight of draft step j's loss is step_decay ** j (1.0 = all steps equal). A later draft
    # only pays off when every earlier one was accepted, so the early steps matter most.
    step_decay: float = 1.0
    # Hidden size / layers of the draft model (kind="draft-model").
    draft_model_hidden: int = 64
    draft_model_layers: int = 2
    # How the draft model starts (DRAFT_MODEL_INITS): "random", or "target": a copy of the
    # target's embedding (and LM head), its first `draft_model_layers` layers and its final norm,
    # which needs a Llama target and draft_model_hidden equal to the target's width. The copy is
    # the draft model's own (its memory and KV cache are a standalone model's); it is trained
    # from there like a random one.
    draft_model_init: str = "random"
    # Width / layers of a Gemma 4 assistant (kind="gemma4-assistant"); its attention reads the
    # target's store layers, so heads and head dims are the target's. Layers: sliding ones, the
    # last full attention (HF's assistant reads both kinds of the target's keys).
    assistant_hidden: int = 256
    assistant_layers: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in TRAIN_KINDS:
            raise InputError(f"kind must be one of {', '.join(TRAIN_KINDS)}, got {self.kind!r}.")
        if self.max_draft_tokens < 1 or self.epochs < 1 or self.batch_size < 1:
            raise InputError("max_draft_tokens, epochs and batch_size must be >= 1.")
        if self.min_steps < 0 or self.warmup_steps < 0:
            raise InputError(f"min_steps and warmup_steps must be >= 0, got {self.min_steps} and {self.warmup_steps}.")
        if not 0.0 <= self.warmup_fraction <= 1.0:
            raise InputError(f"warmup_fraction must be in [0, 1], got {self.warmup_fraction}.")
        if not 0.0 <= self.holdout < 1.0:
            raise InputError("holdout must be in [0, 1).")
        if self.lr <= 0:
            raise InputError("lr must be > 0.")
        if self.micro_batch_tokens < 0:
            raise InputError(f"micro_batch_tokens must be >= 0 (0 = whole batches), got {self.micro_batch_tokens}.")
        if self.tv_weight < 0:
            raise InputError(f"tv_weight must be >= 0, got {self.tv_weight}.")
        if self.round_weight < 0:
            raise InputError(f"round_weight must be >= 0, got {self.round_weight}.")
        if not 0.0 < self.step_decay <= 1.0:
            raise InputError(f"step_decay must be in (0, 1], got {self.step_decay}.")
        if self.draft_model_hidden < 1 or self.draft_model_layers < 1:
            raise InputError("draft_model_hidden and draft_model_layers must be >= 1.")
        if self.draft_model_init not in DRAFT_MODEL_INITS:
            raise InputError(f"draft_model_init must be one of {', '.join(DRAFT_MODEL_INITS)}, "
                             f"got {self.draft_model_init!r}.")
        if self.assistant_hidden < 1 or self.assistant_layers < 1:
            raise InputError("assistant_hidden and assistant_layers must be >= 1.")

    def plan(self, steps_per_epoch: int) -> tuple[int, int]:
        """(epochs, warm-up steps) of a run whose epoch is `steps_per_epoch` optimizer steps:
        `epochs`, raised until the run takes `min_steps`; a warm-up of `warmup_fraction` of the
        run (rounded up), at most `warmup_steps`."""
        epochs = max(self.epochs, math.ceil(self.min_steps / max(1, steps_per_epoch)))
        total = epochs * steps_per_epoch
        return epochs, min(self.warmup_steps, math.ceil(self.warmup_fraction * total))
