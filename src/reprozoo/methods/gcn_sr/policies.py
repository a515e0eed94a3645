"""The two expression generators (torch) and the risk-seeking policy-gradient loss.

Both policies define a distribution over SPBTs (complete expressions of depth <= D) under the same
structural constraints (``expressions.scaffold_context``) and expose the same two calls:
``sample(B, generator) -> (B, N)`` SPBT arrays, and ``log_prob(a) -> (log p(a), entropy)``
recomputed with gradients for the few samples a policy-gradient step uses.

GCNPolicy (GCN-SR). Level-wise autoregressive node-attribute prediction on the fixed scaffold::

    p(a) = prod_{d=0..D} prod_{i: level(i)=d, i used} p(a_i | a_{level < d})

Pass d feeds the scaffold with node features  h_i = E_sym[a_i or UNASSIGNED] + E_pos[i]  (levels
< d decoded, the rest UNASSIGNED) through a GCN (Kipf-Welling propagation on the tree's
parent-child adjacency) and reads a softmax over the symbols at every slot of level d; all slots of
a level and all B expressions are decoded in one batched call, D + 1 calls per batch whatever the
expressions' shapes. Slots below EMPTY or terminal parents are EMPTY and carry no probability.

RNNPolicy (DSR, Petersen et al. ICLR 2021). An LSTM emits the expression token by token in
pre-order; its input at each step is the embedding of the current slot's parent and left sibling
(DSR's parent-sibling input), its output a softmax over the symbols under the same constraints.

Risk-seeking policy gradient (DSR, Eq. 3): with R_eps the (1 - eps)-quantile of a batch's rewards,
    grad J = mean_{i: R_i >= R_eps} (R_i - R_eps) grad log p(tau_i) + lambda_H grad H
which optimises the best-case rather than the mean reward.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ...blocks.gcn import GCNStack, normalized_adjacency
from .expressions import (ARITY, EMPTY, TRIG, UNASSIGNED, V, allowed_symbols, levels, n_nodes,
                          preorder_slots, scaffold_context, tree_adjacency)


def _masked_sample(logits: torch.Tensor, mask: torch.Tensor, gen: torch.Generator) -> np.ndarray:
    probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).reshape(probs.shape[:-1]).numpy()


def _masked_logp_entropy(logits: torch.Tensor, mask: torch.Tensor, tok: torch.Tensor, used: torch.Tensor):
    """Sum over used slots of log p(tok) and of the entropy, masking forbidden symbols."""
    lg = logits.masked_fill(~mask, float("-inf"))
    logp = torch.log_softmax(lg, dim=-1)
    p = logp.exp()
    ent = -(p * torch.where(mask, logp, torch.zeros_like(logp))).sum(-1)
    lp_tok = torch.gather(logp, -1, tok.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    usedf = used.to(logits.dtype)
    return torch.where(used, lp_tok, torch.zeros_like(lp_tok)).sum(-1), (ent * usedf).sum(-1)


class GCNPolicy(nn.Module):
    def __init__(self, max_depth: int, width: int = 32, layers: int = 3):
        super().__init__()
        self.max_depth, self.n = max_depth, n_nodes(max_depth)
        self.level = levels(max_depth)
        self.sym = nn.Embedding(V + 2, width)          # symbols, EMPTY, UNASSIGNED
        self.pos = nn.Embedding(self.n, width)
        self.gcn = GCNStack(normalized_adjacency(tree_adjacency(max_depth)), width, layers)
        self.head = nn.Linear(width, V)

    def logits(self, a: torch.Tensor) -> torch.Tensor:
        """(B, N) scaffold attributes -> (B, N, V) symbol logits at every slot."""
        h = self.sym(a) + self.pos.weight
        return self.head(self.gcn(h))

    def sample(self, batch: int, gen: torch.Generator) -> np.ndarray:
        a = np.full((batch, self.n), UNASSIGNED, dtype=np.int64)
        with torch.no_grad():
            for d in range(self.max_depth + 1):
                slots = np.flatnonzero(self.level == d)
                active, _, _, mask = scaffold_context(a, self.max_depth)
                m = mask[:, slots]
                # a slot with one allowed symbol (the terminal at level D) has it with probability
                # 1: only trees with a used, free slot on this level need the network pass
                tok = np.argmax(m, -1)
                need = np.flatnonzero(np.any(active[:, slots] & (m.sum(-1) > 1), axis=1))
                if len(need):
                    tok[need] = _masked_sample(self.logits(torch.from_numpy(a[need]))[:, slots],
                                               torch.from_numpy(m[need]), gen)
                a[:, slots] = np.where(active[:, slots], tok, EMPTY)
        return a

    def log_prob(self, a: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """log p(a) and entropy summed over used slots, for complete SPBTs ``a (M, N)``."""
        a = np.atleast_2d(a)
        m, d1 = len(a), self.max_depth + 1
        # pass d sees levels < d decoded; all D + 1 passes of all M trees in one batched call
        inp = np.where(self.level[None, None, :] < np.arange(d1)[:, None, None], a[None], UNASSIGNED)
        lg = self.logits(torch.from_numpy(inp.reshape(d1 * m, self.n))).reshape(d1, m, self.n, V)
        lg = lg[torch.from_numpy(self.level), :, torch.arange(self.n)].transpose(0, 1)   # (M, N, V)
        active, _, _, mask = scaffold_context(a, self.max_depth)
        tok = torch.from_numpy(np.where(active, a, 0))
        return _masked_logp_entropy(lg, torch.from_numpy(mask), tok, torch.from_numpy(active))


class RNNPolicy(nn.Module):
    NONE = V   # "no parent / no sibling" input

    def __init__(self, max_depth: int, width: int = 32, embed: int = 16):
        super().__init__()
        self.max_depth, self.n = max_depth, n_nodes(max_depth)
        self.level = levels(max_depth)
        self.emb = nn.Embedding(V + 1, embed)
        self.cell = nn.LSTMCell(2 * embed, width)
        self.head = nn.Linear(width, V)
        self.width = width

    def _inputs(self, parent: np.ndarray, sibling: np.ndarray) -> torch.Tensor:
        return torch.cat([self.emb(torch.from_numpy(parent)), self.emb(torch.from_numpy(sibling))], -1)

    def sample(self, batch: int, gen: torch.Generator) -> np.ndarray:
        """Pre-order decoding of ``batch`` trees at once: each row keeps its own stack of open
        slots (an array and a pointer), rows whose stack is empty are finished (their LSTM input
        is ignored)."""
        a = np.full((batch, self.n), EMPTY, dtype=np.int64)
        trig = np.zeros((batch, self.n), dtype=bool)       # sin/cos above the slot
        stack = np.zeros((batch, self.n + 1), dtype=np.int64)   # slot 0 (the root) on every stack
        sp = np.ones(batch, dtype=np.int64)
        h = c = torch.zeros(batch, self.width)
        rows = np.arange(batch)
        is_trig = np.isin(np.arange(V), TRIG)
        with torch.no_grad():
            while np.any(sp > 0):
                live = sp > 0
                sp = np.where(live, sp - 1, 0)
                pos = np.where(live, stack[rows, sp], 0)
                parent = np.where(pos > 0, a[rows, (pos - 1) // 2], self.NONE)
                is_right = (pos > 0) & (pos % 2 == 0)
                sibling = np.where(is_right, a[rows, np.maximum(pos - 1, 0)], self.NONE)
                mask = allowed_symbols(np.where(pos > 0, parent, -1), trig[rows, pos], self.level[pos], self.max_depth)
                h, c = self.cell(self._inputs(parent, sibling), (h, c))
                tok = _masked_sample(self.head(h), torch.from_numpy(mask), gen)
                r, i, t = rows[live], pos[live], tok[live]
                a[r, i] = t
                below = trig[r, i] | is_trig[t]
                two, one = ARITY[t] == 2, ARITY[t] >= 1
                r2, i2 = r[two], i[two]
                trig[r2, 2 * i2 + 2] = below[two]
                stack[r2, sp[r2]] = 2 * i2 + 2          # right operand below the left one
                sp[r2] += 1
                r1, i1 = r[one], i[one]
                trig[r1, 2 * i1 + 1] = below[one]
                stack[r1, sp[r1]] = 2 * i1 + 1
                sp[r1] += 1
        return a

    def log_prob(self, a: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced log p(a) and entropy along each tree's pre-order."""
        a = np.atleast_2d(a)
        m = len(a)
        _, parent, _, mask = scaffold_context(a, self.max_depth)
        orders = [preorder_slots(row) for row in a]
        t_max = max(len(o) for o in orders)
        pos = np.zeros((m, t_max), dtype=np.int64)
        valid = np.zeros((m, t_max), dtype=bool)
        for k, o in enumerate(orders):
            pos[k, :len(o)], valid[k, :len(o)] = o, True
        rows = np.arange(m)[:, None]
        par = np.where(pos > 0, a[rows, (pos - 1) // 2], self.NONE)
        is_right = (pos > 0) & (pos % 2 == 0)
        sib = np.where(is_right, a[rows, np.maximum(pos - 1, 0)], self.NONE)
        h = c = torch.zeros(m, self.width)
        logits = []
        for t in range(t_max):
            h, c = self.cell(self._inputs(par[:, t], sib[:, t]), (h, c))
            logits.append(self.head(h))
        lg = torch.stack(logits, 1)                               # (M, T, V)
        tok = np.where(valid, a[rows, pos], 0)
        msk = mask[rows, pos] | ~valid[..., None]
        return _masked_logp_entropy(lg, torch.from_numpy(msk), torch.from_numpy(tok), torch.from_numpy(valid))


def make_policy(kind: str, max_depth: int, cfg: dict) -> nn.Module:
    if kind == "gcn":
        return GCNPolicy(max_depth, cfg.get("width", 32), cfg.get("layers", 3))
    if kind == "rnn":
        return RNNPolicy(max_depth, cfg.get("width", 32), cfg.get("embed", 16))
    raise ValueError(f"unknown policy '{kind}' (gcn or rnn)")


def risk_seeking_selection(rewards: np.ndarray, eps: float) -> tuple[np.ndarray, float]:
    """Indices of the batch's top-eps fraction (R >= (1 - eps)-quantile) and the quantile R_eps."""
    r_eps = float(np.quantile(rewards, 1.0 - eps))
    return np.flatnonzero(rewards >= r_eps), r_eps


def risk_seeking_loss(logp: torch.Tensor, entropy: torch.Tensor, advantages: np.ndarray,
                      entropy_coef: float) -> torch.Tensor:
    """-mean((R - R_eps) log p) - lambda_H mean(H) over the selected samples."""
    adv = torch.as_tensor(advantages, dtype=logp.dtype)
    return -(adv * logp).mean() - entropy_coef * entropy.mean()
