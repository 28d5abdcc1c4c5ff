"""Cached target activations: run the frozen target once over the training data, keep what the
head needs, and train for many epochs without re-running it.

Per sample (T tokens): the head's input features (T, F), the cached keys and values of the
layer it attends to (Hk, T, hd) each, and the target's top-k next-token log-probabilities
(T, k) with their token ids (computed only on the rows a loss reads: from the last prompt
row on). Stored in bf16/fp16 shards with a manifest that records the target identity and the
head settings they were computed for; an interrupted build resumes at the first missing shard.

Training streams from these shards instead of holding them in memory (~2 KB per token: 5M
tokens would be ~10 GB): `load_cache` returns a `Samples` view whose items are read from the
memory-mapped shard files when indexed, so RAM holds a batch at a time and the OS page cache
keeps whatever fits.

Where the cache would not fit the disk (20M tokens: ~40 GB), `online_samples` gives the same
view with nothing stored: each item is computed by the target when it is read, exactly as
`build_cache` computes and rounds it, so training on it takes the same steps as training on the
cache, at the price of one target forward per sample per epoch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ..core.target import Target
from ..errors import DataError
from .shards import DataRef, read_manifest

MANIFEST = "activations.json"
PER_SHARD = 64  # samples a cache shard holds
NO_TEACHER = -1e4  # a prompt row's teacher log-probs: no loss term reads them (`activations`)


@dataclass
class Sample:
    ids: torch.Tensor  # (T,) long
    prompt_len: int
    hidden: torch.Tensor  # (T, F)
    keys: torch.Tensor  # (Hk, T, hd)
    values: torch.Tensor  # (Hk, T, hd)
    top_logp: torch.Tensor  # (T, k) teacher log-probs of its k most likely next tokens
    top_ids: torch.Tensor  # (T, k)


def build_cache(target: Target, data: str | Path | DataRef, cache_dir: str | Path, hidden_layers: tuple[int, ...],
                kv_layer: int, teacher_topk: int = 32, max_len: int = 768, per_shard: int = PER_SHARD,
                progress: bool = True, bar: tqdm | None = None) -> dict[str, Any]:
    """Cache the target's activations on `data` (a data directory or its first N shards) in
    cache_dir. Resumable, and a cache only grows: once the set has grown, only its new samples are
    computed, and a cache that already covers a prefix of the set is used as it is.

    bar: a progress bar shared by several sets (`train_on_data`: one bar over all of a run's
    shards, so that a build of hours shows one remaining time): this set's shards are added to it,
    those already cached as its starting count (its rate counts only the shards computed)."""
    ref = DataRef.parse(data)
    samples = ref.samples()
    out = Path(cache_dir)
    out.mkdir(parents=True, exist_ok=True)
    kv = target.layer_index(kv_layer)
    settings = cache_settings(target, ref, hidden_layers, kv_layer, teacher_topk, max_len, per_shard)
    n_shards = cache_shards(len(samples), per_shard)
    mpath = out / MANIFEST
    done = 0
    if mpath.is_file():
        old = _read_manifest(out)
        if old["settings"] != settings:
            raise DataError(f"{out} holds activations for other settings; delete it or use another --out.")
        if _covered(old) >= len(samples):
            if bar is not None:
                _skip(bar, n_shards)
            return old  # samples come in the same order: the first len(samples) are cached already
        # The data set may have grown since (more shards from `mtpspec data`): its samples come in
        # the same order, so every full shard stays valid and only the rest is computed.
        done = min(old["num_shards"], old.get("num_samples", 0) // per_shard, len(samples) // per_shard)
        if old.get("num_samples") == len(samples):
            done = old["num_shards"]  # the same data: resume an interrupted build, or nothing to do
    own = bar is None
    if bar is None:
        bar = tqdm(total=n_shards, initial=done, desc="caching target activations", unit="shard", disable=not progress)
    else:
        _skip(bar, done)
        bar.set_postfix_str(ref.path.name, refresh=False)
    for s in range(done, n_shards):
        tensors: dict[str, torch.Tensor] = {}
        for i, (ids, pl) in enumerate(samples[s * per_shard:(s + 1) * per_shard]):
            tensors.update({f"{i}.{k}": v for k, v in activations(target, ids[:max_len], pl, hidden_layers, kv,
                                                                   teacher_topk).items()})
        save_file(tensors, str(out / f"act_{s:05d}.safetensors"))
        mpath.write_text(json.dumps({"settings": settings, "num_samples": len(samples), "num_shards": s + 1,
                                     "total_shards": n_shards}))
        bar.update(1)
    if own:
        bar.close()
    return json.loads(mpath.read_text())


def _skip(bar: tqdm, n: int) -> None:
    """Count n shards found cached on a shared bar as if it had started with them (tqdm's
    `initial`), so its rate and remaining time count only the shards computed."""
    if bar.disable:  # a disabled tqdm keeps no counts
        return
    bar.initial += n
    bar.n += n
    bar.last_print_n += n
    bar.refresh()


def cache_shards(n_samples: int, per_shard: int = PER_SHARD) -> int:
    """How many shards `build_cache` writes for a set of n samples."""
    return -(-n_samples // per_shard)


def cache_settings(target: Target, ref: DataRef, hidden_layers: tuple[int, ...], kv_layer: int, teacher_topk: int,
                   max_len: int, per_shard: int) -> dict[str, Any]:
    """What a cache's manifest records it was computed for: two caches with the same settings hold
    the same tensors for the same samples."""
    settings = {
        "target": asdict(target.identity()),
        "data": read_manifest(ref.path)["settings"],
        "hidden_layers": list(hidden_layers),
        "kv_layer": target.layer_index(kv_layer),
        "teacher_topk": teacher_topk,
        "max_len": max_len,
        "per_shard": per_shard,
        "dtype": str(target.dtype).removeprefix("torch."),
    }
    if ref.first:  # a slice `DIR:A-B`: its samples start at shard A, not at the set's first
        settings["first_shard"] = ref.first
    return settings


@torch.no_grad()
def activations(target: Target, ids: torch.Tensor, prompt_len: int, hidden_layers: tuple[int, ...], kv: int,
                teacher_topk: int) -> dict[str, torch.Tensor]:
    """One sample's stored tensors, as a shard holds them (ids and prompt length int32; features,
    keys and values rounded to bf16; teacher log-probs to fp16): ids (T,) -> the target's run.

    The teacher's log-probs only where training reads them: row t holds the law of x_{t+1}, and
    every loss term predicts an answer token, so rows from prompt_len - 1 on. The prompt's rows
    hold `NO_TEACHER` (log-prob -1e4, id 0, as padding does): the LM head and its softmax are a
    third of a forward's cost, and prompts are about half the kept data's tokens."""
    T = ids.shape[0]
    first = min(max(prompt_len - 1, 0), T - 1)  # a prompt cut at max_len: its last row, read by nothing
    cache = target.new_cache()
    step = target.forward(ids[None].to(target.device), cache, hidden_layers, logits_to_keep=T - first)
    keys, values = cache.layer(kv)  # (1, Hk, T, hd)
    top = step.logits[0].log_softmax(-1).topk(teacher_topk, dim=-1)  # over (T - first, V)
    top_logp = torch.full((T, teacher_topk), NO_TEACHER, dtype=torch.float16)
    top_ids = torch.zeros(T, teacher_topk, dtype=torch.int32)
    top_logp[first:], top_ids[first:] = top.values.to(torch.float16).cpu(), top.indices.int().cpu()
    return {  # on the CPU, whatever device the target computes on
        "ids": ids.int().cpu(),
        "prompt_len": torch.tensor([prompt_len], dtype=torch.int32),
        "hidden": step.hidden[0].to(torch.bfloat16).contiguous().cpu(),
        "keys": keys[0].to(torch.bfloat16).contiguous().cpu(),  # a view of the cache's first T slots
        "values": values[0].to(torch.bfloat16).contiguous().cpu(),
        "top_logp": top_logp,
        "top_ids": top_ids,
    }


def _covered(m: dict[str, Any]) -> int:
    """How many of the set's first samples a cache manifest holds: every shard but the last of
    a finished cache is full."""
    if m["num_shards"] >= m["total_shards"]:
        return m["num_samples"]
    return m["num_shards"] * m["settings"]["per_shard"]


def _read_manifest(d: Path) -> dict[str, Any]:
    try:
        m = json.loads((d / MANIFEST).read_text())
        if all(k in m for k in ("settings", "num_shards", "total_shards")):
            return m
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError):
        pass
    raise DataError(f"{d / MANIFEST} is damaged; delete {d} and run again to rebuild the cache.")


class Shard:
    """One activations shard, opened lazily and memory-mapped; tensors are read on access."""

    def __init__(self, path: Path):
        self.path = path
        self._handle: Any = None
        with safe_open(str(path), "pt") as f:  # the header only
            self.size = len({k.split(".")[0] for k in f.keys()})

    def get(self, i: int, name: str) -> torch.Tensor:
        if self._handle is None:
            self._handle = safe_open(str(self.path), "pt")
        return self._handle.get_tensor(f"{i}.{name}")

    def sample(self, i: int) -> Sample:
        g = self.get
        return Sample(ids=g(i, "ids").long(), prompt_len=int(g(i, "prompt_len")[0]), hidden=g(i, "hidden"),
                      keys=g(i, "keys"), values=g(i, "values"), top_logp=g(i, "top_logp"),
                      top_ids=g(i, "top_ids").long())


class OnlineSource:
    """A data set's samples with their activations computed when read (`online_samples`): the
    same `get` / `sample` as a `Shard`, nothing stored. The target is frozen and each forward
    starts from an empty cache, so a sample's tensors are the same whenever they are read."""

    def __init__(self, target: Target, samples: Sequence[tuple[torch.Tensor, int]], hidden_layers: tuple[int, ...],
                 kv_layer: int, teacher_topk: int, max_len: int):
        self.target, self.samples = target, samples
        self.hidden_layers, self.kv = hidden_layers, target.layer_index(kv_layer)
        self.teacher_topk, self.max_len = teacher_topk, max_len

    def get(self, i: int, name: str) -> torch.Tensor:
        ids, pl = self.samples[i]
        if name == "ids":
            return ids[:self.max_len].int()
        if name == "prompt_len":
            return torch.tensor([pl], dtype=torch.int32)
        return self._tensors(i)[name]

    def _tensors(self, i: int) -> dict[str, torch.Tensor]:
        ids, pl = self.samples[i]
        return activations(self.target, ids[:self.max_len], pl, self.hidden_layers, self.kv, self.teacher_topk)

    def sample(self, i: int) -> Sample:
        t = self._tensors(i)
        return Sample(ids=t["ids"].long(), prompt_len=int(t["prompt_len"][0]), hidden=t["hidden"], keys=t["keys"],
                      values=t["values"], top_logp=t["top_logp"], top_ids=t["top_ids"].long())


class Samples(Sequence[Sample]):
    """A view of samples stored in activation shards: `samples[i]` reads sample i from disk;
    slicing, `pick` and `+` build other views without reading anything."""

    def __init__(self, refs: list[tuple[Shard | OnlineSource, int]]):
        self.refs = refs

    def __len__(self) -> int:
        return len(self.refs)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return Samples(self.refs[i])
        shard, j = self.refs[i]
        return shard.sample(j)

    def __add__(self, other: Samples) -> Samples:
        return Samples(self.refs + other.refs)

    def pick(self, order: list[int]) -> Samples:
        return Samples([self.refs[i] for i in order])

    def tokens(self) -> Iterator[tuple[torch.Tensor, int]]:
        """(ids, prompt length) of every sample, without reading the activations."""
        for shard, j in self.refs:
            yield shard.get(j, "ids").long(), int(shard.get(j, "prompt_len")[0])


def load_cache(cache_dir: str | Path, limit: int | None = None) -> Samples:
    """The samples of a finished activations directory (its first `limit` samples, if given: the
    cache of a set that has grown since), as a lazily read view."""
    d = Path(cache_dir)
    if not (d / MANIFEST).is_file():
        raise DataError(f"{d} holds no cached activations ({MANIFEST} missing).")
    m = _read_manifest(d)
    if limit is None and m["num_shards"] < m["total_shards"]:
        raise DataError(f"{d} is incomplete ({m['num_shards']}/{m['total_shards']} shards); rerun to finish it.")
    if limit is not None and _covered(m) < limit:
        raise DataError(f"{d} holds {_covered(m)} samples' activations, not the {limit} asked for; rerun to cache them.")
    shards = m["num_shards"] if limit is None else min(m["num_shards"], -(-limit // m["settings"]["per_shard"]))
    refs = []
    for s in range(shards):
        path = d / f"act_{s:05d}.safetensors"
        try:
            shard = Shard(path)
        except (OSError, SafetensorError) as e:
            raise DataError(f"{path} is missing or unreadable ({e}); delete {d} and run again to rebuild it.") from None
        refs += [(shard, i) for i in range(shard.size)]
    return Samples(refs if limit is None else refs[:limit])


def online_samples(target: Target, data: str | Path | DataRef, hidden_layers: tuple[int, ...], kv_layer: int,
                   teacher_topk: int = 32, max_len: int = 768, caches: Sequence[Path] = ()) -> Samples:
    """A data set (a directory or its first N shards) as a `Samples` view whose activations the
    target computes when a sample is read, bit for bit what `build_cache` would store for it
    (the same target and dtype): training without an activation cache on disk.

    caches: activation directories that may already hold some of them (`find_cache`): the set's
    first samples that one of them holds are read from its shards, the same tensors, and only
    the rest is computed (a run too big for the disk continues from the cache of a smaller one)."""
    ref = DataRef.parse(data)
    source = OnlineSource(target, ref.samples(), hidden_layers, kv_layer, teacher_topk, max_len)
    n = len(source.samples)
    found = find_cache(target, ref, caches, hidden_layers, kv_layer, teacher_topk, max_len)
    cached = min(_covered(found[1]), n) if found else 0
    head = load_cache(found[0], cached) if cached else Samples([])
    return head + Samples([(source, i) for i in range(cached, n)])


def find_cache(target: Target, ref: DataRef, caches: Sequence[Path], hidden_layers: tuple[int, ...], kv_layer: int,
               teacher_topk: int, max_len: int) -> tuple[Path, dict[str, Any]] | None:
    """The directory among `caches` (and its manifest) whose activations were computed for this
    target, data set and head settings (any shard size), the one holding the most samples; None
    if none was. Unreadable or damaged manifests are skipped: nothing is read from them."""
    want = cache_settings(target, ref, hidden_layers, kv_layer, teacher_topk, max_len, per_shard=0)
    best: tuple[Path, dict[str, Any]] | None = None
    for d in caches:
        try:
            m = _read_manifest(Path(d))
        except (DataError, OSError):
            continue
        if {**m["settings"], "per_shard": 0} == want and (best is None or _covered(m) > _covered(best[1])):
            best = (Path(d), m)
    return best


def token_frequencies(samples: Samples, vocab_size: int) -> torch.Tensor:
    """(V,) counts of the tokens the head will have to draft: the responses, not the prompts."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, prompt_len in samples.tokens():
        counts += torch.bincount(ids[prompt_len:], minlength=vocab_size)
    return counts
