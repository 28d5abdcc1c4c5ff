"""Simulate draft shapes on candidates collected by collect.py: at every position of the
target's greedy output, the head's candidate tree (width 4, beam 4, depth 6) and the greedy
continuation. Greedy acceptance of any subtree is its longest path that matches the
continuation, so every shape can be scored on the same rounds without running the target.

Time per round comes from a cost model in ms (bf16, 2 threads, this machine; `mtpspec costs`):
a verify pass V0, plus ROW per extra row, plus PLANE per branch off the spine (each attends its
own copy of the cache), plus STEP per head step (TREE_STEP when the drafter builds a tree).

    python reports/drafting/tree-shapes/simulate.py /tmp/sim-builtin.pkl
    python reports/drafting/tree-shapes/simulate.py /tmp/sim-builtin.pkl 0.020 0.056 0.097   # row plane step

Optional row, plane and step prices, as fractions of a one-token forward (what `mtpspec costs`
prints as `RoundCosts`), replace the cost model's ms (V0 stays the unit); a chain step then
costs `step` too, and the sweep adds larger node budgets.
"""
import math
import pickle
import sys
from collections import defaultdict

V0, ROW, PLANE, STEP, TREE_STEP = 42.0, 0.3, 3.7, 2.0, 2.45
PRICED = len(sys.argv) > 2
if PRICED:
    ROW, PLANE, STEP = (float(a) * V0 for a in sys.argv[2:5])
    TREE_STEP = STEP
rows = pickle.load(open(sys.argv[1], "rb"))


def depths(nodes):
    d = []
    for _, par, _ in nodes:
        d.append(1 if par < 0 else d[par] + 1)
    return d


def accepted(nodes, sel, seq, L):
    cur, a, sel = -1, 0, set(sel)
    while L + 1 + a < len(seq):
        nxt = [i for i in sel if nodes[i][1] == cur and nodes[i][0] == seq[L + 1 + a]]
        if not nxt:
            break
        cur, a = nxt[0], a + 1
    return a


def planes(nodes, sel):
    """As the decode loop verifies: the spine (first child, repeatedly) on the cache, then each
    other node continues its parent's chain if the parent is a chain's tail, else a new plane."""
    sel = sorted(sel)
    kids = defaultdict(list)
    for i in sel:
        kids[nodes[i][1]].append(i)
    spine, cur = [], -1
    while kids[cur]:
        cur = kids[cur][0]
        spine.append(cur)
    tails, P = {spine[-1]} if spine else set(), 1
    for i in sel:
        if i in spine:
            continue
        if nodes[i][1] in tails:
            tails.discard(nodes[i][1])
        else:
            P += 1
        tails.add(i)
    return P


class Chain:
    def __init__(self, k):
        self.k = k

    def __call__(self, nodes):
        sel, cur = [], -1
        for i, (_, par, _) in enumerate(nodes):
            if par == cur and len(sel) < self.k:
                sel.append(i)
                cur = i
        self.steps = len(sel)
        return sel

    def cost(self, sel, P):
        return V0 + ROW * len(sel) + STEP * self.steps


class HFSchedule(Chain):
    """HF assisted generation's `num_assistant_tokens_schedule="heuristic"` on the head's chain:
    k + 2 after a round that accepted every draft, k - 1 (at least 1) otherwise."""

    def __init__(self, k=4, max_k=6):
        super().__init__(k)
        self.max_k = max_k

    def feedback(self, tokens, sel, P):
        self.k = min(self.max_k, self.k + 2) if tokens - 1 == len(sel) else max(1, self.k - 1)


class FixedTree:
    """The fixed shape before cost shaping: the best 8 nodes at most 4 deep, off-spine nodes only
    with cumulative probability >= 0.1."""

    def __call__(self, nodes):
        d, spine = depths(nodes), set(Chain(4)(nodes))
        sel = []
        for i, (_, par, sc) in enumerate(nodes):
            if len(sel) < 8 and d[i] <= 4 and (par < 0 or par in sel) and (i in spine or math.exp(sc) >= 0.1):
                sel.append(i)
        self.steps = max((d[i] for i in sel), default=0)
        return sel

    def cost(self, sel, P):
        return V0 + ROW * len(sel) + PLANE * (P - 1) + TREE_STEP * self.steps


class CostShaped:
    """`TreeDrafter.shaped_by_cost` on the collected candidates."""

    def __init__(self, row=ROW / V0, plane=PLANE / V0, step=TREE_STEP / V0, share=0.3, max_nodes=8, max_depth=6,
                 beam=4, alpha=0.1, credit=False):
        self.c = (row, plane, step)
        self.share, self.max_nodes, self.max_depth, self.beam, self.alpha = share, max_nodes, max_depth, beam, alpha
        self.tpr, self.cpr = 2.0, 1.2
        # credit (`branch_credit`): a branch's first node counts the drafts its branch is expected
        # to add after it: the running mean of accepted drafts after the first, in rounds that
        # accepted one.
        self.credit, self.continuation = credit, 0.5

    def __call__(self, nodes):
        row, plane, step = self.c
        value = self.tpr / self.cpr
        kids = defaultdict(list)
        for i, (_, par, _) in enumerate(nodes):
            kids[par].append(i)
        sel, tails, frontier, self.steps = [], {-1}, [-1], 0
        for depth in range(1, self.max_depth + 1):
            self.steps = depth
            cand = sorted((i for f in frontier for i in kids[f]), key=lambda i: -nodes[i][2])
            born = []
            for i in cand:
                if len(sel) == self.max_nodes:
                    break
                par = nodes[i][1]
                price = row + (0 if par in tails else plane)
                starts = par not in tails
                gain = math.exp(nodes[i][2]) * (1 + self.continuation if starts and self.credit else 1)
                if gain >= price * value:
                    sel.append(i)
                    born.append(i)
                    tails.discard(par)
                    tails.add(i)
            mass = sum(math.exp(nodes[i][2]) for i in born)
            if not born or len(sel) == self.max_nodes or mass * self.share < step * value:
                break
            frontier = born[: self.beam]
        return sel

    def cost(self, sel, P):
        return V0 + ROW * len(sel) + PLANE * (P - 1) + TREE_STEP * self.steps

    def feedback(self, tokens, sel, P):
        row, plane, step = self.c
        self.tpr += self.alpha * (tokens - self.tpr)
        if tokens >= 2:
            self.continuation += self.alpha * (tokens - 2 - self.continuation)
        self.cpr += self.alpha * (1 + row * len(sel) + plane * (P - 1) + step * self.steps - self.cpr)


def simulate(policy):
    tokens = rounds = nrows = nplanes = 0
    ms = 0.0
    for r in rows:
        seq, T, L = r["seq"], r["T"], r["T"]
        while L < len(seq) - 1:
            nodes = r["nodes"][L - T]
            sel = policy(nodes)
            a = min(accepted(nodes, sel, seq, L), len(seq) - 1 - L)
            P = planes(nodes, sel)
            tokens, rounds, nrows, nplanes = tokens + a + 1, rounds + 1, nrows + len(sel) + 1, nplanes + P
            ms += policy.cost(sel, P)
            if hasattr(policy, "feedback"):
                policy.feedback(a + 1, sel, P)
            L += a + 1
    return tokens / rounds, nrows / rounds, nplanes / rounds, ms / tokens


bins = defaultdict(lambda: [0, 0.0, 0])
for r in rows:
    seq, T = r["seq"], r["T"]
    for off, nodes in enumerate(r["nodes"]):
        d, ok = depths(nodes), {}
        for i, (tok, par, sc) in enumerate(nodes):
            pos = T + off + d[i]
            reached = (par < 0 or ok[par]) and pos < len(seq)
            ok[i] = reached and seq[pos] == tok
            if reached:
                cond = math.exp(sc - (nodes[par][2] if par >= 0 else 0.0))
                b = bins[min(int(cond * 10), 9)]
                b[0], b[1], b[2] = b[0] + 1, b[1] + cond, b[2] + ok[i]
print("Calibration: a node's draft probability given its parent vs how often the target agreed\n")
print("| bin | nodes | mean draft probability | target agreed |\n|---|---|---|---|")
for b in sorted(bins):
    n, s, k = bins[b]
    print(f"| {b / 10:.1f}-{(b + 1) / 10:.1f} | {n} | {s / n:.3f} | {k / n:.3f} |")
policies = {f"chain k = {k}": Chain(k) for k in range(1, 7)}
policies["HF's heuristic schedule on the chain (k from 4, +2 / -1, at most 6)"] = HFSchedule()
policies["fixed tree (8 nodes, depth 4, floor 0.1)"] = FixedTree()
for share in (0.3, 0.5, 1.0):
    for pm in (0.7, 1.0, 1.4):
        policies[f"cost-shaped, deeper_share {share}, plane x{pm}"] = CostShaped(plane=pm * PLANE / V0, share=share)
policies["cost-shaped, deeper_share 0.3, plane x1.0, branch_credit"] = CostShaped(credit=True)
policies["cost-shaped chain (no branches: plane price x1000)"] = CostShaped(plane=1000 * PLANE / V0)
if PRICED:
    policies["cost-shaped at RoundCosts()'s default prices (the Xeon's), timed at these"] = CostShaped(
        row=0.007, plane=0.09, step=0.058)
    policies["the same, branch_credit"] = CostShaped(row=0.007, plane=0.09, step=0.058, credit=True)
    for n in (12, 16):
        for credit in (False, True):
            policies[f"cost-shaped, at most {n} nodes" + (", branch_credit" if credit else "")] = CostShaped(
                max_nodes=n, credit=credit)
print("\n| shape | tokens / round | verify rows | planes | ms / token (model) | x plain |\n|---|---|---|---|---|---|")
for name, pol in policies.items():
    tpr, M, P, ms = simulate(pol)
    print(f"| {name} | {tpr:.3f} | {M:.2f} | {P:.2f} | {ms:.2f} | {V0 / ms:.3f}x |")
