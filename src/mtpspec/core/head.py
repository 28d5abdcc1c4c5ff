"""The MTP head: a small recurrent drafter that cross-attends to the target's own KV cache.

Letters: B batch, T positions, D target hidden size, F head input features
(D * len(hidden_layers)), H query heads, Hk target key/value heads, hd head dim, S cached
positions, V vocabulary (or the reduced draft vocabulary), K draft steps.

One draft step j, given the state s_j (the target's features at the last verified position
for j = 0, the head's own output afterwards) and the token x at position L + j:

    x_in  = fc([norm(s_j); norm(embed(x))])            # embed: the target's, shared
    x_in += o(attn(q(x_in) @ RoPE(L + j), K_l, V_l))   # K_l, V_l: the target's cache, layer l
    x_in += mlp(x_in)
    s_{j+1} = x_in;  logits = lm_head(final_norm(s_{j+1}))   # both the target's, shared

The head never sees its own keys for the context: it reads the target's (already RoPE'd)
keys and values in place, so it has no prefill and nothing that grows with the context.
Everything it shares goes through the target's own methods, so it sees what the decoder stack
sees: `embed_tokens` (Gemma's and Granite's embedding scales), `final_norm`, `finish_logits`
(Granite's logits_scaling, Gemma 2's soft-cap) and `rope` (layer l's RoPE: its table, none in
a NoPE layer, Helium's interleaved pairs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from ..config import HeadConfig, SamplingConfig
from ..errors import HeadMismatchError, InputError
from . import fused
from .draft import Draft, DraftInput
from .kernels import linear
from .rope import apply_rope, signed_sin
from .sampling import probs_from_logits, sample
from .target import Target, TargetIdentity

CONFIG_NAME = "mtp_head.json"
WEIGHTS_NAME = "mtp_head.safetensors"
FORMAT_VERSION = 1


def _read_meta(d: Path) -> dict[str, Any]:
    if not (d / CONFIG_NAME).is_file() or not (d / WEIGHTS_NAME).is_file():
        raise InputError(f"{d} is not a saved mtpspec head: expected {CONFIG_NAME} and {WEIGHTS_NAME} in it.")
    try:
        meta = json.loads((d / CONFIG_NAME).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{d} is not a readable mtpspec head: {CONFIG_NAME} is damaged ({e}). Save the head again.") from None
    missing = [k for k in ("head_config", "target") if k not in meta]
    if missing:
        raise InputError(f"{d} is not a readable mtpspec head: {CONFIG_NAME} lacks {', '.join(missing)} (it was not "
                         "written by save_pretrained). Save the head again.")
    return meta


def saved_head_config(directory: str | Path) -> HeadConfig:
    """The architecture of a head saved by `MTPHead.save_pretrained`, without loading it."""
    return HeadConfig.from_dict(_read_meta(Path(directory))["head_config"])


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def lin(layer: nn.Linear | torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x @ W^T for a layer (or a bare weight). A draft step runs one to a few rows, where
    `F.linear` takes a slow matrix-vector path on CPUs (bf16 above all): for up to 16 rows use
    W @ x^T on at least two rows instead (the same product; 2-5x faster here for 1 row)."""
    w = layer if isinstance(layer, torch.Tensor) else layer.weight
    rows = x.reshape(-1, x.shape[-1])  # (R, I)
    if rows.shape[0] > 16 or torch.is_grad_enabled():
        return F.linear(x, w)
    return linear(rows, w, None, "wxt_pad2").reshape(*x.shape[:-1], w.shape[0])


class CrossBlock(nn.Module):
    """Pre-norm block: cross-attention to the target's cached K/V, then a SwiGLU MLP."""

    def __init__(self, D: int, H: int, hd: int, mlp_hidden: int, eps: float, interleaved_rope: bool = False):
        super().__init__()
        self.H, self.hd = H, hd
        self.interleaved_rope = interleaved_rope  # rotate queries as the target rotated its keys
        self.norm_attn = RMSNorm(D, eps)
        self.q_proj = nn.Linear(D, H * hd, bias=False)
        self.o_proj = nn.Linear(H * hd, D, bias=False)
        self.mlp_hidden = mlp_hidden
        if mlp_hidden:
            self.norm_mlp = RMSNorm(D, eps)
            self.gate_up = nn.Linear(D, 2 * mlp_hidden, bias=False)
            self.down = nn.Linear(mlp_hidden, D, bias=False)

    def forward(
        self,
        x: torch.Tensor,  # (B, T, D)
        cos: torch.Tensor,  # (B, T, hd)
        sin: torch.Tensor,  # (B, T, hd)
        keys: torch.Tensor,  # (B, Hk, S, hd), RoPE applied by the target
        values: torch.Tensor,  # (B, Hk, S, hd)
        mask: torch.Tensor | None,  # (T, S) or (B, 1, T, S) bool, True = may attend; None = all keys (drafting)
    ) -> torch.Tensor:
        B, T, D = x.shape
        q = lin(self.q_proj, self.norm_attn(x)).view(B, T, self.H, self.hd).transpose(1, 2)  # (B, H, T, hd)
        q = apply_rope(q, cos.unsqueeze(1), sin.unsqueeze(1), self.interleaved_rope)
        a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)  # (B, H, T, hd)
        x = x + lin(self.o_proj, a.transpose(1, 2).reshape(B, T, self.H * self.hd))  # (B, T, D)
        if self.mlp_hidden:
            g, u = lin(self.gate_up, self.norm_mlp(x)).chunk(2, dim=-1)  # (B, T, M) each
            x = x + lin(self.down, F.silu(g) * u)
        return x


class MTPHead(nn.Module):
    """Drafts tokens for a frozen target. Implements the `Drafter` protocol."""

    def __init__(self, target: Target, config: HeadConfig, draft_ids: torch.Tensor | None = None):
        super().__init__()
        D = target.hidden_size
        eps = float(getattr(target.config, "rms_norm_eps", 1e-6))
        self.config = config
        # Drafts per round that measured best for this head, one int or one per dtype (see
        # `mtpspec.pretrained.default_k`), saved with the head; None = the package fallback.
        self.recommended_k: int | dict[str, int] | None = None
        self.target = target  # a plain object, not a submodule: nothing of it is saved or counted
        self.kv_layer = target.layer_index(config.kv_layer)
        n_feat = len(config.hidden_layers)
        for i in config.hidden_layers:
            if not -(target.num_layers + 1) <= i <= target.num_layers:
                raise InputError(f"hidden layer {i} out of range for {target.num_layers} layers (+ embeddings).")
        self.fuse = nn.Linear(n_feat * D, D, bias=False) if n_feat > 1 else None
        self.norm_state = RMSNorm(D, eps)
        self.norm_embed = RMSNorm(D, eps)
        self.fc = nn.Linear(2 * D, D, bias=False)
        mlp_hidden = int(round(config.mlp_ratio * D))
        self.blocks = nn.ModuleList(
            CrossBlock(D, target.num_heads, target.kv_shape(self.kv_layer)[1], mlp_hidden, eps, target.interleaved_rope)
            for _ in range(config.num_blocks)
        )
        self._init_weights()
        # Reduced draft vocabulary: ids (saved with the head) and the rows of the target's LM
        # head they select (derived, not saved; counted in inference_bytes).
        if config.draft_vocab_size:
            if draft_ids is None:
                draft_ids = torch.arange(config.draft_vocab_size)
            if draft_ids.numel() != config.draft_vocab_size or int(draft_ids.max()) >= target.vocab_size:
                raise InputError(
                    f"draft_ids must hold {config.draft_vocab_size} ids below {target.vocab_size}."
                )
            self.register_buffer("draft_ids", draft_ids.long().clone())
            self.register_buffer("draft_weight", target.lm_head_rows(self.draft_ids).detach().clone(), persistent=False)
        else:
            self.draft_ids = None
            self.draft_weight = None
        # Drafting adds the context's own tokens outside a reduced draft vocabulary to each
        # round's vocabulary (`round_vocab`): answers copy names, numbers and rare words from
        # the prompt, and a token outside the vocabulary can never be drafted. Training is
        # unchanged (it scores the draft vocabulary only).
        self.copy_context = True
        # (dtype, the draft step as one C call or None), made on first use: see `fused_step`
        self.__dict__["_fused"] = None
        # (L, k, dtype) -> a round's rotary rows, as `rope` computes them (see `round_rope`)
        self.__dict__["_rope_memo"] = {}
        self.__dict__["_draft_set"] = None  # (draft_ids, their set), made on first use: see `_draft_members`
        self.to(device=target.device)

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        # Start the recurrent state as "the target's features", so step 0 is a good guess of
        # the target's own next-next token before any training: fc passes the state through.
        D = self.fc.weight.shape[0]
        with torch.no_grad():
            self.fc.weight[:, :D] += torch.eye(D)
            if self.fuse is not None:  # fused features start as the deepest layer's alone (the
                # one-layer head's start); the other layers' columns start at zero and are learned
                n_feat, layers = self.target.num_layers + 1, self.config.hidden_layers  # as Target.forward counts
                j = max(range(len(layers)), key=lambda k: layers[k] % n_feat)
                self.fuse.weight.zero_()
                self.fuse.weight[:, j * D:(j + 1) * D] = torch.eye(D)
            for b in self.blocks:
                b.o_proj.weight.mul_(0.1)
                if b.mlp_hidden:
                    b.down.weight.mul_(0.1)

    # -- construction and persistence -------------------------------------------------------
    @classmethod
    def for_target(cls, target: Any, config: HeadConfig | None = None, draft_ids: torch.Tensor | None = None) -> MTPHead:
        """A freshly initialised head for a target (a `Target` or a Hugging Face model)."""
        t = target if isinstance(target, Target) else Target(target)
        return cls(t, config or HeadConfig(), draft_ids).to(dtype=t.dtype)

    def save_pretrained(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        ident = self.target.identity()
        meta = {
            "format_version": FORMAT_VERSION,
            "head_config": self.config.to_dict(),
            "target": ident.__dict__,
            "recommended_k": self.recommended_k,
        }
        state = {k: (v.detach().float() if v.is_floating_point() else v).contiguous().cpu()
                 for k, v in self.state_dict().items()}
        save_file(state, str(d / WEIGHTS_NAME))
        (d / CONFIG_NAME).write_text(json.dumps(meta, indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, directory: str | Path, target: Any) -> MTPHead:
        """Load a head saved by `save_pretrained` beside the target it was trained for."""
        d = Path(directory)
        meta = _read_meta(d)
        t = target if isinstance(target, Target) else Target(target)
        check_identity(TargetIdentity(**meta["target"]), t.identity(), d)
        try:
            state = load_file(str(d / WEIGHTS_NAME))
        except Exception as e:  # safetensors raises its own SafetensorError for a damaged file
            raise InputError(f"{d} is not a readable mtpspec head: {WEIGHTS_NAME} is damaged or truncated ({e}). "
                             "Copy or save the head again.") from None
        try:
            head = cls(t, HeadConfig.from_dict(meta["head_config"]), state.get("draft_ids"))
            head.load_state_dict(state)
        except (RuntimeError, TypeError) as e:
            raise InputError(f"{d} is not a readable mtpspec head: {WEIGHTS_NAME} does not match {CONFIG_NAME} "
                             f"({str(e).splitlines()[0]}). Save the head again.") from None
        head.recommended_k = meta.get("recommended_k")
        return head.to(dtype=t.dtype)

    # -- sizes ------------------------------------------------------------------------------
    def num_parameters(self) -> int:
        """Trainable parameters the head owns (the target's shared modules are not counted)."""
        return sum(p.numel() for p in self.parameters())

    def inference_bytes(self) -> int:
        """Bytes the head adds beside the target at inference: its parameters and buffers
        (the reduced-vocabulary LM-head rows, if any). It holds no KV cache."""
        return sum(t.numel() * t.element_size() for t in list(self.parameters()) + list(self.buffers()))

    # -- the model --------------------------------------------------------------------------
    def rope(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary cos/sin the target's layer kv_layer gave its keys, at (B, T) positions, in
        the head's dtype."""
        cos, sin = self.target.rope(positions, like, self.kv_layer)  # (B, T, hd) each
        return cos.to(like.dtype), sin.to(like.dtype)

    def step(self, state: torch.Tensor, tokens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """One draft step for T positions at once: (B, T, D) state, (B, T) tokens -> (B, T, D)."""
        e = self.target.embed_tokens(tokens)  # (B, T, D)
        x = lin(self.fc, torch.cat([self.norm_state(state), self.norm_embed(e)], dim=-1))  # (B, T, D)
        for block in self.blocks:
            x = block(x, cos, sin, keys, values, mask)
        return x

    def project(self, normed: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        """The target's LM head (or its draft-vocabulary rows, then `extra` rows: a round's
        additions from `round_vocab`) on an already-normed state, then the target's own logit
        scaling and soft-cap."""
        w = self.target.lm_projection.dense(self.target.dtype) if self.draft_weight is None else self.draft_weight
        z = lin(w, normed)  # (..., V')
        if extra is not None:
            z = torch.cat([z, lin(extra, normed)], dim=-1)  # (..., V' + E)
        return self.target.finish_logits(z)

    def round_vocab(self, context: torch.Tensor, memo: dict | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The vocabulary one drafting round scores: (ids (V'',), the LM head's rows for the ids
        beyond the draft vocabulary (E, D) or None); ids None = the whole vocabulary. With a
        reduced draft vocabulary and `copy_context`: the draft vocabulary, then the tokens of
        `context` (1, L) outside it, ascending.

        `memo`: the request's scratch (`DraftInput.memo`), where the last round's vocabulary is
        kept with the context length it covered. A request's context only grows, so the next
        round looks at its new tokens alone, and adds rows only for ids it has not seen (each
        row is the LM head's own, as computed over the whole context: the same tensors). 8
        requests a step on SmolLM2: ~150 us a round over the whole context, a few us here."""
        if self.draft_ids is None:
            return None, None
        if not self.copy_context:
            return self.draft_ids, None
        if memo is None:
            return self._round_vocab_whole(context)
        L = int(context.shape[1])
        kept = memo.get("round_vocab")  # (positions covered, the id at the last of them, extra ids, ids, rows)
        tail = [] if kept is None or not 0 < kept[0] <= L else context[0, kept[0] - 1:].tolist()
        if not tail or tail[0] != kept[1]:  # nothing kept (or kept for another context): the whole context
            ids, extra = self._round_vocab_whole(context)
            members = frozenset(ids[len(self.draft_ids):].tolist())
        else:
            _, _, members, ids, extra = kept
            draft = self._draft_members()
            new = sorted({t for t in tail[1:] if t not in members and t not in draft})
            if new:
                members = members | frozenset(new)
                new_ids = torch.tensor(new, dtype=torch.long, device=context.device)
                new_rows = self.target.lm_head_rows(new_ids).to(self.draft_weight.dtype)
                old = ids[len(self.draft_ids):]
                merged, order = torch.cat([old, new_ids]).sort(stable=True)  # (E,): ascending, as nonzero gives them
                ids = torch.cat([self.draft_ids, merged])
                extra = (new_rows if extra is None else torch.cat([extra, new_rows]))[order]
        memo["round_vocab"] = (L, int(context[0, -1]) if L else None, members, ids, extra)
        return ids, extra

    def _draft_members(self) -> frozenset[int]:
        """The draft vocabulary's ids as a set (made once per head and vocabulary)."""
        made = self.__dict__.get("_draft_set")
        if made is None or made[0] is not self.draft_ids:
            made = (self.draft_ids, frozenset(self.draft_ids.tolist()))
            self.__dict__["_draft_set"] = made
        return made[1]

    def _round_vocab_whole(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`round_vocab` from the whole context (1, L)."""
        seen = torch.zeros(self.target.vocab_size, dtype=torch.bool, device=context.device)
        seen[context.flatten()] = True
        seen[self.draft_ids] = False
        extra = seen.nonzero()[:, 0]  # (E,) ascending
        if extra.numel() == 0:
            return self.draft_ids, None
        return torch.cat([self.draft_ids, extra]), self.target.lm_head_rows(extra).to(self.draft_weight.dtype)

    def initial_state(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, T, F) target features -> (B, T, D) the state before the first draft step."""
        return hidden if self.fuse is None else lin(self.fuse, hidden)

    def forward(self, hidden: torch.Tensor, tokens: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                num_steps: int, rows: int | torch.Tensor = 0,
                extra: torch.Tensor | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Training-time unroll over whole sequences, exactly as drafting runs it.

        A row at position t stands for "the last verified position is t": the state starts at the
        target's features h_t, step j feeds token x_{t+1+j} at position t+1+j, and attention sees
        the target's keys 0..t only. `rows` says which rows are computed (the prompt's rows need
        no drafts): an int s = positions s..T-1 of every sequence (R = T - s), or a (B, R) long
        tensor of each sequence's own positions, so that sequences whose answers start at
        different places pad only to the longest answer, not to the longest sequence; a position
        past T - 1 is padding (computed at T - 1, for the caller to mask out). Returns, per step,
        (the state after the target's final norm (B, R, D), logits (B, R, V')); row [b, r] of
        step j predicts x_{t+2+j}, t = rows[b, r]. The normed state estimates the target's own
        final hidden at t+1+j. `extra` (E, D): LM-head rows scored after the draft vocabulary's,
        as `round_vocab` adds the context's tokens when drafting (logits (B, R, V' + E)).
        """
        B, T, F_ = hidden.shape
        if isinstance(rows, int):
            rows = torch.arange(rows, T, device=hidden.device).expand(B, -1)
        at = rows.clamp(max=T - 1)  # (B, R) the row's position t
        state = self.initial_state(hidden.gather(1, at.unsqueeze(-1).expand(-1, -1, F_)))  # (B, R, D)
        mask = (torch.arange(T, device=hidden.device).view(1, 1, T) <= at.unsqueeze(-1)).unsqueeze(1)  # (B, 1, R, T)
        padded = F.pad(tokens, (0, num_steps + 1))  # zeros past the end
        out = []
        for j in range(num_steps):
            tok = padded.gather(1, at + 1 + j)  # (B, R): x_{t+1+j}
            cos, sin = self.rope(at + 1 + j, state)
            state = self.step(state, tok, cos, sin, keys, values, mask)
            normed = self.target.final_norm(state)
            out.append((normed, self.project(normed, extra)))
        return out

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """The target features the head starts from (the `Drafter` protocol)."""
        return self.config.hidden_layers

    def update(self, drafted: int, accepted: int) -> None:
        """The head drafts the same way whatever the last round accepted."""

    @torch.no_grad()
    def propose(self, inp: DraftInput, k: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft:
        """Draft k tokens, one after another, from the target's cache and last hidden state."""
        if (fast := self.fused_step()) is not None:  # each step as one C call
            return self._propose_fused(fast, [inp], [k], [sampling], [generator])[0]
        keys, values = inp.cache.layer(self.kv_layer)  # (1, Hk, L, hd), views of the target's cache
        L = keys.shape[2]
        state = self.initial_state(inp.hidden.unsqueeze(1))  # (1, 1, D)
        tok = inp.tokens[:, -1:]  # (1, 1): the token at position L
        cos_all, sin_all = self.rope(torch.arange(L, L + k, device=state.device).unsqueeze(0), state)  # (1, K, hd)
        ids, extra = self.round_vocab(inp.tokens)  # (V'',), (E, D): this round's vocabulary
        drafted: list[torch.Tensor] = []
        qs: list[torch.Tensor] = []
        for j in range(k):
            state = self.step(state, tok, cos_all[:, j:j + 1], sin_all[:, j:j + 1], keys, values, None)
            logits = self.project(self.target.final_norm(state), extra)[:, 0]  # (1, V'')
            tok = self._pick(logits, ids, sampling, generator, drafted, qs)
        return self._draft(drafted, qs)

    @torch.no_grad()
    def propose_many(self, inps: list[DraftInput], ks: list[int], samplings: list[SamplingConfig],
                     generators: list[torch.Generator | None]) -> list[Draft]:
        """`propose` for several requests at once (continuous batching): each draft step runs the
        rows of every request still drafting as one fused call (each with its own round
        vocabulary, `round_vocab`); each request gets, bit for bit and draw for draw from its own
        generator, the draft `propose` gives it alone. Where the step does not run fused, the
        requests draft one after another."""
        if (fast := self.fused_step()) is None:
            return [self.propose(i, k, s, g) for i, k, s, g in zip(inps, ks, samplings, generators)]
        return self._propose_fused(fast, inps, ks, samplings, generators)

    def _propose_fused(self, fast: fused.FusedHead, inps: list[DraftInput], ks: list[int],
                       samplings: list[SamplingConfig], generators: list[torch.Generator | None]) -> list[Draft]:
        """The drafts of one or more requests, each draft depth of all of them as one C call;
        greedy requests' whole chains as one call (`FusedHead.chain_many`) where it can."""
        n = len(inps)
        starts = [self._round_start(inp, k) for inp, k in zip(inps, ks)]
        if all(s.greedy for s in samplings) and max(ks, default=0) > 0 and (part := fast.chain_part()) is not None:
            chains = fast.chain_many(part, [st for st, _, _ in starts], [int(inp.tokens[0, -1]) for inp in inps],
                                     [t for _, t, _ in starts], [inp.cache for inp in inps], self.kv_layer,
                                     [v for _, _, v in starts])
            if chains is not None:  # greedy requests' whole chains as one C call
                return [Draft(tokens=t) for t in chains]
        states = [s for s, _, _ in starts]
        tables = [t for _, t, _ in starts]
        vocab = [v for _, _, v in starts]
        toks = [inp.tokens[:, -1:] for inp in inps]  # (1, 1) each: the token at position L
        drafted: list[list[torch.Tensor]] = [[] for _ in range(n)]
        qs: list[list[torch.Tensor]] = [[] for _ in range(n)]
        for j in range(max(ks, default=0)):
            live = [i for i in range(n) if ks[i] > j]
            out, logits = fast.step_many(torch.cat([states[i] for i in live], 1), torch.cat([toks[i] for i in live], 1),
                                         torch.stack([tables[i][0][j] for i in live]),
                                         torch.stack([tables[i][1][j] for i in live]),
                                         [inps[i].cache for i in live], [1] * len(live), self.kv_layer,
                                         [vocab[i][1] for i in live])
            for r, i in enumerate(live):  # (1, R, D); logits[r]: (1, V'' of request i)
                states[i] = out[:, r:r + 1]
                toks[i] = self._pick(logits[r], vocab[i][0], samplings[i], generators[i], drafted[i], qs[i])
        return [self._draft(d, q) for d, q in zip(drafted, qs)]

    def _round_start(self, inp: DraftInput, k: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor],
                                                             tuple[torch.Tensor | None, torch.Tensor | None]]:
        """One request's drafting round as the fused step reads it: the start state (1, 1, D), the
        rotary tables (cos, signed sin) (k, hd) of its k positions, and its round vocabulary
        (`round_vocab`: ids (V'',) or None, extra rows (E, D) or None)."""
        state = self.initial_state(inp.hidden.unsqueeze(1))
        return state, self.round_rope(inp.cache.length, k, state), self.round_vocab(inp.tokens, inp.memo)

    def round_rope(self, L: int, k: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin), (k, hd) each, at positions L .. L + k - 1: `rope`'s own call for
        exactly these positions, kept per (L, k, dtype) where the target's table depends on the
        positions only (`fused.STATIC_ROPE`), as the fused forward keeps its own (~75 us a
        request a round on SmolLM2)."""
        static = getattr(self.target.rotary_emb, "rope_type", None) in fused.STATIC_ROPE
        memo = self.__dict__["_rope_memo"]
        key = (L, k, like.dtype, like.device)
        if static and (hit := memo.get(key)) is not None:
            return hit
        cos, sin = self.rope(torch.arange(L, L + k, device=like.device).unsqueeze(0), like)  # (1, K, hd)
        got = cos[0], signed_sin(sin[0])
        if static:
            if len(memo) >= fused.ROPE_CACHE:
                memo.clear()
            memo[key] = got
        return got

    def _pick(self, logits: torch.Tensor, ids: torch.Tensor | None, sampling: SamplingConfig,
              generator: torch.Generator | None, drafted: list[torch.Tensor], qs: list[torch.Tensor]) -> torch.Tensor:
        """One draft token from (1, V'') logits over `ids` (None: the whole vocabulary): the argmax,
        or a draw whose full-vocabulary law is appended to `qs`. Appends the token (1, 1) to
        `drafted` and returns it."""
        if sampling.greedy:
            idx = logits.argmax(-1)  # (1,)
        else:
            q_small = probs_from_logits(logits, sampling)  # (1, V'')
            idx = sample(q_small, generator)
            qs.append(self._to_full_vocab(q_small, ids))
        tok = (idx if ids is None else ids[idx]).view(1, 1)
        drafted.append(tok)
        return tok

    @staticmethod
    def _draft(drafted: list[torch.Tensor], qs: list[torch.Tensor]) -> Draft:
        tokens = torch.cat(drafted, dim=1).view(-1) if drafted else torch.empty(0, dtype=torch.long)
        return Draft(tokens=tokens, q=torch.cat(qs, 0) if qs else None)

    def fused_step(self) -> fused.FusedHead | None:
        """The draft step as one C call (`fused.FusedHead`) where the target runs the fused
        forward and this head is bf16 on the CPU; else None (the step runs op by op)."""
        made = self.__dict__["_fused"]
        if made is None or made[0] != self.fc.weight.dtype or (made[1] is not None and not made[1].current()):
            ok = fused.head_unsupported(self) is None
            made = (self.fc.weight.dtype, fused.FusedHead(self) if ok else None)
            self.__dict__["_fused"] = made  # a plain attribute: nothing of it is saved or counted
        return made[1]

    def _to_full_vocab(self, q: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
        """(1, V'') over `ids` -> (1, V): probabilities of tokens outside them are 0."""
        if ids is None:
            return q
        full = q.new_zeros(1, self.target.vocab_size)
        return full.index_copy_(1, ids, q)


def check_identity(saved: TargetIdentity, actual: TargetIdentity, where: Path) -> None:
    diffs = [
        f"{name}: head has {getattr(saved, name)!r}, target has {getattr(actual, name)!r}"
        for name in saved.__dataclass_fields__
        if getattr(saved, name) != getattr(actual, name)
    ]
    if diffs:
        raise HeadMismatchError(
            f"The head in {where} was trained for a different target ({'; '.join(diffs)}). "
            "Train a head for this target with `mtpspec data` + `mtpspec train`."
        )
