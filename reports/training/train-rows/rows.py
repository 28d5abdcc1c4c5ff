"""Rows a training step computes per answer row that carries a loss term, over random batches of
a data set's samples (token counts only: no target, no cache).

    python reports/training/train-rows/rows.py DATA_DIR [DATA_DIR ...]

`before`: every row from the batch's shortest prompt on (mtpspec before c0fe164); `own rows`:
each sequence from its own answer on (`answer_rows`); `own rows, sorted`: the same with each
batch's parts cut from its samples sorted by answer length (`by_answer_length`). Batches of 16,
parts of at most 4,096 padded tokens (`token_chunks`), 400 batches, seed 0; K = 6 draft steps.
"""
import random
import sys

from mtpspec.training.shards import load_samples

K, BATCH, PART = 6, 16, 4096
S = [(int(ids.numel()), int(pl)) for d in sys.argv[1:] for ids, pl in load_samples(d)]


def parts(batch):
    groups, longest = [], 0
    for n, pl in batch:
        if groups and (len(groups[-1]) + 1) * max(n, longest) <= PART:
            groups[-1].append((n, pl))
            longest = max(n, longest)
        else:
            groups.append([(n, pl)])
            longest = n
    return groups


def first(pl):
    return max(0, pl - 1 - K)


for label, key in (("before", None), ("own rows", None), ("own rows, sorted", lambda s: s[1] - s[0])):
    random.seed(0)
    computed = useful = 0
    for _ in range(400):
        batch = random.sample(S, BATCH)
        if key:
            batch.sort(key=key)
        for g in parts(batch):
            if label == "before":
                computed += len(g) * (max(n for n, _ in g) - max(0, min(pl for _, pl in g) - 2))
            else:
                computed += len(g) * max(n - first(pl) for n, pl in g)
            useful += sum(n - first(pl) for n, pl in g)
    print(f"{label:18s} rows computed / rows with a term: {computed / useful:.2f}")
print(f"{len(S)} samples")
