"""The on-disk form of self-distillation data: token ids only, compact enough to keep in git.

A data directory holds `manifest.json` (target identity, settings, counts, resume point) and
numbered shards. A shard is a safetensors file of three tensors - `ids` (all samples' tokens
concatenated; uint16 when the vocabulary fits, else int32), `lengths` and `prompt_lengths` -
compressed with xz (`shard_00000.safetensors.xz`; the v3 SmolLM2 sets take ~0.6 bytes per token).
Shards are written once and never rewritten, so a data set that grows over several sessions
adds files instead of changing them. Plain `.safetensors` shards (the earlier format) are
still read.
"""

from __future__ import annotations

import json
import lzma
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from ..errors import DataError

MANIFEST = "manifest.json"
MANIFEST_KEYS = ("target", "settings", "num_samples", "num_shards", "num_tokens", "prompts_consumed")
SUFFIX = ".safetensors.xz"


def shard_path(data_dir: Path, index: int) -> Path:
    """The shard's path: the compressed form, or a plain .safetensors one an older run wrote."""
    packed = data_dir / f"shard_{index:05d}{SUFFIX}"
    plain = data_dir / f"shard_{index:05d}.safetensors"
    return plain if plain.is_file() and not packed.is_file() else packed


def write_shard(path: Path, samples: list[tuple[list[int], int]]) -> None:
    """samples: (token ids of prompt + response, prompt length). Written atomically."""
    flat = [t for s, _ in samples for t in s]
    dtype = torch.uint16 if max(flat, default=0) < 2**16 else torch.int32
    tensors = {"ids": torch.tensor(flat, dtype=torch.int64).to(dtype),
               "lengths": torch.tensor([len(s) for s, _ in samples], dtype=torch.int32),
               "prompt_lengths": torch.tensor([p for _, p in samples], dtype=torch.int32)}
    raw = st_save(tensors)
    blob = lzma.compress(raw, preset=9) if path.name.endswith(".xz") else raw
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(blob)
    tmp.rename(path)


def read_shard(path: Path) -> list[tuple[torch.Tensor, int]]:
    """(token ids (T,) int64, prompt length) per sample of one shard."""
    try:
        blob = path.read_bytes()
        t = st_load(lzma.decompress(blob) if path.name.endswith(".xz") else blob)
        ids, lengths, pls = t["ids"], t["lengths"], t["prompt_lengths"]
    except (OSError, SafetensorError, lzma.LZMAError, KeyError) as e:
        raise DataError(f"{path} is missing or unreadable ({e}). Rerun `mtpspec data` with the same flags "
                        "to rewrite it.") from None
    seqs = torch.split(ids.to(torch.int64), lengths.tolist())
    return [(seq, int(pl)) for seq, pl in zip(seqs, pls.tolist())]


def save_manifest(out: Path, m: dict[str, Any]) -> None:
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(m))
    tmp.rename(out / MANIFEST)


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    """The manifest of a data directory written by `mtpspec data`; a DataError if there is none
    or it is not one."""
    d = Path(data_dir)
    path = d / MANIFEST
    if not path.is_file():
        raise DataError(f"{d} is not an mtpspec data directory (no {MANIFEST}); run `mtpspec data` first.")
    try:
        m = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not valid JSON ({e}); delete {d} and run `mtpspec data` again.") from None
    missing = [k for k in MANIFEST_KEYS if not isinstance(m, dict) or k not in m]
    if missing:
        raise DataError(f"{path} is not an mtpspec data manifest (missing {', '.join(missing)}); "
                        f"delete {d} and run `mtpspec data` again.")
    return m


def load_samples(data_dir: str | Path, shards: int | None = None, first: int = 0) -> list[tuple[torch.Tensor, int]]:
    """All (token ids (T,), prompt length) pairs of a data directory, in shard order; of its
    first `shards` shards only, if given; from shard `first` on."""
    d = Path(data_dir)
    n = DataRef(d, shards, first).num_shards()
    out = [s for i in range(first, n) for s in read_shard(shard_path(d, i))]
    if not out:
        raise DataError(f"{d} holds no samples yet.")
    return out


@dataclass(frozen=True)
class DataRef:
    """A data directory, or only its first `shards` shards (`DIR:N` on the command line), or its
    shards `first` to `shards` - 1 (`DIR:A-B`).

    Kept sets grow across sessions while a recipe names the data a head was trained on: a set's
    shards are written once, in order, so its first N shards are the same samples forever, and
    so are shards A to B - 1: a head continued session by session on the next slice of a set
    names each slice.
    """

    path: Path
    shards: int | None = None
    first: int = 0

    @classmethod
    def parse(cls, text: str | Path | DataRef) -> DataRef:
        """`DIR`, `DIR:N` (N >= 1) or `DIR:A-B` (0 <= A < B); a directory whose own name ends in
        `:digits` (or `:digits-digits`) is taken whole."""
        if isinstance(text, DataRef):
            return text
        s = str(text)
        head, sep, tail = s.rpartition(":")
        if sep and head and not Path(s).exists():
            if tail.isdigit():
                return cls(Path(head), int(tail))
            a, dash, b = tail.partition("-")
            if dash and a.isdigit() and b.isdigit():
                if int(a) >= int(b):
                    raise DataError(f"`{s}`: a slice `DIR:A-B` takes shards A to B - 1, so A must be below B.")
                return cls(Path(head), int(b), int(a))
        return cls(Path(s))

    def num_shards(self) -> int:
        """The end of the shards this reference covers (shards `first` up to it); a DataError if
        it asks for more than the set has."""
        m = read_manifest(self.path)
        if self.shards is None:
            if self.first >= m["num_shards"]:
                raise DataError(f"{self.path} has {m['num_shards']} shards; a slice cannot start at {self.first}.")
            return m["num_shards"]
        if not 1 <= self.shards <= m["num_shards"]:
            n = m["num_shards"]
            form = f"`{self.path}:A-B` takes B" if self.first else f"`{self.path}:N` takes N"
            raise DataError(f"{self.path} has {n} shard{'s' * (n != 1)}; {form} from 1 to {n}, not {self.shards}.")
        return self.shards

    def samples(self) -> list[tuple[torch.Tensor, int]]:
        return load_samples(self.path, self.shards, self.first)

    def __str__(self) -> str:
        if self.first:
            return f"{self.path}:{self.first}-{self.shards}"
        return str(self.path) if self.shards is None else f"{self.path}:{self.shards}"
