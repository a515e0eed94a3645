"""Expert importance rules and the knowledge-preserving re-fit, on calibration batches.

All rules score every expert of every MoE layer from the SAME calibration batches of the dense
model, and then the lowest-scored fraction ``s`` of experts in each layer is removed (layer-wise
uniform sparsity, as REAP does). Notation of ``moe.py``: token t, router probabilities p_t, top-k
set K_t, gate values w_{t,j}, expert outputs f_j(x_t), block output y_t.

* ``frequency`` (baseline): S_j = #{t : j in K_t}, how often the router picks expert j.
* ``random`` (control): S_j uniform at random (a seeded generator): the same number of experts
  removed per layer, with no information; the rule every informed rule must beat (``random_refit``:
  the same removals followed by the re-fit below).
* ``reap`` (baseline, REAP of Lasby et al. 2025): S_j = mean over {t : j in K_t} of
  w_{t,j} ||f_j(x_t)||_2, router weight x activation norm, averaged over the tokens routed to j.
* ``step`` (the paper's method, our reading of it; see README):
  1. **selective tokens**: only the fraction ``token_frac`` of target positions with the highest
     next-token loss l_t in each calibration batch count (0.5, highest loss first: our guess at the
     paper's selection; ``token_frac`` 1.0 is the token-agnostic ablation, ``select="random"`` the
     placebo with as many random positions) (the informative tokens, whose
     contribution a token-uniform average dilutes). The objective that is differentiated is their
     loss alone, L_sel = mean_{s in Sel} l_s: the gradient is backpropagated from the selected
     tokens only, never from the others;
  2. **loss-aware evaluation**: removing expert j changes position t's block output by
     Dy_{t,j} = y_t^{(-j)} - y_t, where y^{(-j)} re-routes t to its best k experts other than j
     (renormalised gate values, exactly what the pruned router does). To first order the selected
     tokens' loss changes by <dL_sel/dy_t, Dy_{t,j}>; the score is
     S_j = sum_{t : j in K_t} |<dL_sel/dy_t, Dy_{t,j}>| (absolute value: a saliency, so that removals
     which help some tokens and hurt others do not cancel). The sum runs over every position whose
     change reaches a selected token's loss: in the last MoE layer only the selected positions
     themselves (dL_sel/dy_t = 0 elsewhere), in earlier layers also the earlier positions a selected
     token attends to;
  3. **knowledge preservation** (``preserve_knowledge``): after removal, layer by layer, the kept
     experts' down projections D_j are re-fitted in closed form so that the pruned block
     reproduces the dense block on the calibration tokens:
         min_D sum_t || y_t^dense - sum_{j in K'_t} w'_{t,j} D_j a_j(x_t) ||^2 + lam ||D - D_0||^2
     a ridge regression (features w'_{t,j} a_j(x_t), one block of I columns per kept expert),
     where x_t is the input the pruned model actually feeds the layer (earlier layers already
     pruned and re-fitted) and y^dense is the dense layer's output on that same input.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from . import moe


class _Capture:
    """Forward hooks that keep each MoE block's input (N, d) and output (grad retained)."""

    def __init__(self, blocks, keep_output: bool):
        self.x, self.y = {}, {}
        self.handles = [b.register_forward_hook(self._hook(i, keep_output)) for i, b in enumerate(blocks)]

    def _hook(self, i, keep_output):
        def hook(module, inputs, output):
            self.x[i] = inputs[0].detach().reshape(-1, inputs[0].shape[-1])
            if keep_output and output.requires_grad:
                output.retain_grad()
                self.y[i] = output
        return hook

    def close(self):
        for h in self.handles:
            h.remove()


def token_nll(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(B, T) next-token loss in nats at each position; the last position (no target) gets -inf."""
    lg = logits[:, :-1].transpose(1, 2)
    nll = nn.functional.cross_entropy(lg.to(torch.promote_types(lg.dtype, torch.float32)), ids[:, 1:], reduction="none")
    return torch.cat([nll, torch.full_like(nll[:, :1], -float("inf"))], dim=1)


def selected_tokens(nll_flat: torch.Tensor, frac: float, gen: torch.Generator | None = None) -> torch.Tensor:
    """Boolean mask of the ``frac`` highest-loss positions (positions without a target excluded).
    With ``gen``: the same number of positions drawn uniformly at random instead (the placebo
    selection of the ``step_randtok`` control: as many tokens, none chosen by their loss)."""
    valid = torch.isfinite(nll_flat)
    n = max(1, int(round(frac * int(valid.sum()))))
    mask = torch.zeros_like(valid)
    if gen is not None:
        key = torch.rand(nll_flat.shape, generator=gen, dtype=torch.float64).to(nll_flat.device)
        mask[torch.topk(torch.where(valid, key, -torch.ones_like(key)), n).indices] = True
        return mask
    mask[torch.topk(torch.where(valid, nll_flat, -torch.inf), n).indices] = True
    return mask


def removal_deltas(block, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dy_{t,m} = y_t without its m-th routed expert minus y_t, for the k routed slots m:
    (N, k, d), and the experts idx (N, k) they belong to. Without slot m the token takes the
    (k+1)-th best expert and the gate values are renormalised over the new top-k."""
    k = block.gate.top_k
    p, idx, w = moe.route(block, x, extra=1)
    top_p = torch.gather(p, 1, idx)
    f = moe.outputs_at(block, x, idx)                                   # (N, k+1, d)
    y = (w.unsqueeze(-1) * f[:, :k]).sum(1)
    deltas = []
    for m in range(k):
        keep = [i for i in range(k + 1) if i != m]
        pk = top_p[:, keep]
        wk = pk / pk.sum(-1, keepdim=True) if block.gate.norm_topk_prob else pk
        deltas.append((wk.unsqueeze(-1) * f[:, keep]).sum(1) - y)
    return torch.stack(deltas, 1), idx[:, :k]


def expert_scores(model: nn.Module, batches: list[torch.Tensor], rule: str, token_frac: float = 0.5,
                  seed: int = 0, select: str = "loss") -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Importance of every expert per layer under ``rule`` (higher = keep), and the router's usage
    counts per layer (the histogram every rule sees), from calibration batches of token ids.
    ``seed``: the generator of the ``random`` rule and of ``select="random"``. ``step`` only:
    ``token_frac`` is the share of positions whose loss is differentiated (1.0: every token, the
    token-agnostic ablation ``step_alltok``), ``select`` how they are chosen: ``loss`` (highest
    loss first, the paper's selection as we read it) or ``random`` (the placebo control)."""
    if select not in ("loss", "random"):
        raise ValueError(f"select {select!r}: expected loss or random")
    sel_gen = torch.Generator().manual_seed(int(seed) + 7919) if select == "random" else None
    blocks = moe.moe_blocks(model)
    E = [b.gate.num_experts for b in blocks]
    score = [torch.zeros(e, dtype=torch.float64) for e in E]
    count = [torch.zeros(e, dtype=torch.float64) for e in E]
    need_grad = rule == "step"
    model.eval()
    cap = _Capture(blocks, keep_output=need_grad)
    # Only dL/dy of the block outputs is needed, never parameter gradients (30B at paper scale):
    # freeze the parameters and let the graph start at the token embeddings instead.
    frozen = [q for q in model.parameters() if q.requires_grad] if need_grad else []
    for q in frozen:
        q.requires_grad_(False)
    emb_hook = (model.get_input_embeddings().register_forward_hook(lambda mod, inp, out: out.requires_grad_())
                if need_grad else None)
    try:
        for ids in batches:
            model.zero_grad(set_to_none=True)
            with torch.set_grad_enabled(need_grad):
                logits = model(input_ids=ids).logits
                nll = token_nll(logits, ids)
                if need_grad:
                    # selective: only the selected tokens' loss is differentiated (step 1)
                    sel = selected_tokens(nll.detach().reshape(-1), token_frac, sel_gen)
                    nll.reshape(-1)[sel].mean().backward()
            with torch.no_grad():
                for i, b in enumerate(blocks):
                    x = cap.x[i]
                    _, idx, w = moe.route(b, x)
                    count[i] += torch.bincount(idx.reshape(-1).cpu(), minlength=E[i]).double()
                    if rule == "reap":
                        f = moe.outputs_at(b, x, idx)
                        contrib = (w * f.norm(dim=-1)).reshape(-1).double().cpu()
                        score[i] += torch.bincount(idx.reshape(-1).cpu(), contrib, minlength=E[i])
                    elif rule == "step":
                        g = cap.y[i].grad.reshape(-1, x.shape[-1])
                        dy, idx_k = removal_deltas(b, x)
                        taylor = (dy * g.unsqueeze(1)).sum(-1).abs()      # (N, k)
                        score[i] += torch.bincount(idx_k.reshape(-1).cpu(), taylor.reshape(-1).double().cpu(), minlength=E[i])
    finally:
        cap.close()
        if emb_hook is not None:
            emb_hook.remove()
        for q in frozen:
            q.requires_grad_(True)
        model.zero_grad(set_to_none=True)
    if rule == "frequency":
        score = [c.clone() for c in count]
    elif rule == "random":
        gen = torch.Generator().manual_seed(int(seed))
        score = [torch.rand(e, generator=gen, dtype=torch.float64) for e in E]
    elif rule == "reap":
        score = [s / c.clamp(min=1) for s, c in zip(score, count)]
    elif rule != "step":
        raise ValueError(f"unknown pruning rule {rule!r}; known: frequency, random, reap, step")
    return score, count


def keep_sets(scores: list[torch.Tensor], sparsity: float) -> list[list[int]]:
    """Per layer, the experts with the highest scores after removing round(sparsity * E) of them
    (ties broken by expert index, so every run prunes the same experts)."""
    out = []
    for s in scores:
        n_keep = len(s) - int(round(sparsity * len(s)))
        order = sorted(range(len(s)), key=lambda j: (-float(s[j]), j))
        out.append(sorted(order[:n_keep]))
    return out


def rank_corr(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation of two score vectors (average ranks for ties; 0 when either is
    constant): how well one rule's expert ranking matches another ranking, e.g. the true loss of
    removing each expert alone."""
    from scipy.stats import rankdata

    ra, rb = rankdata(a.double().cpu().numpy()), rankdata(b.double().cpu().numpy())
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float((ra ** 2).sum() * (rb ** 2).sum()) ** 0.5
    return float((ra * rb).sum() / den) if den > 0 else 0.0


def keep_difference(a: list[list[int]], b: list[list[int]]) -> float:
    """Experts per layer kept by one rule and removed by the other (half the symmetric difference of
    the keep sets), mean over layers: 0 when two rules prune the same experts."""
    return sum(len(set(x) ^ set(y)) / 2 for x, y in zip(a, b)) / len(a)


def low_usage_share(usage: list[torch.Tensor], frac: float) -> float:
    """Share of routed slots carried by the least-used ``round(frac * E)`` experts of each layer, mean
    over layers: 0 for a router that never uses them, ``frac`` for a uniform one. At ``frac`` = the
    sparsity it is the least any rule can remove, the share frequency pruning removes."""
    out = []
    for u in usage:
        n = int(round(frac * len(u)))
        out.append(float(torch.sort(u.double()).values[:n].sum() / u.double().sum().clamp(min=1e-300)))
    return float(sum(out) / len(out))


def prune(model: nn.Module, keep: list[list[int]]) -> nn.Module:
    """A pruned copy of the model (the dense one is left untouched)."""
    pruned = copy.deepcopy(model)
    for b, k in zip(moe.moe_blocks(pruned), keep):
        moe.prune_block(b, k)
    pruned.config.num_experts = len(keep[0])
    return pruned


def ridge_refit(G: torch.Tensor, B: torch.Tensor, W0: torch.Tensor, ridge: float) -> torch.Tensor:
    """argmin_W ||Phi W - Y||^2 + lam ||W - W0||^2 from G = Phi^T Phi, B = Phi^T Y, with
    lam = ridge x mean(diag G) (scale-free): W = (G + lam I)^-1 (B + lam W0)."""
    lam = ridge * float(G.diagonal().mean().clamp(min=1e-12))
    A = G + lam * torch.eye(G.shape[0], dtype=G.dtype, device=G.device)
    return torch.linalg.solve(A, B + lam * W0)


@torch.no_grad()
def preserve_knowledge(pruned: nn.Module, dense: nn.Module, batches: list[torch.Tensor], ridge: float,
                       max_joint: int = 8192) -> None:
    """Re-fit the kept experts' down projections layer by layer (module docstring, step 3), in place.
    Joint solve over all kept experts of a layer when K*I <= max_joint; otherwise one ridge solve
    per expert against the residual the others leave (block-diagonal, for paper-size layers)."""
    p_blocks, d_blocks = moe.moe_blocks(pruned), moe.moe_blocks(dense)
    pruned.eval()
    for li, (blk, dblk) in enumerate(zip(p_blocks, d_blocks)):
        K, d, I = blk.experts.down_proj.shape
        joint = K * I <= max_joint
        dev = blk.experts.down_proj.device
        f64 = dict(dtype=torch.float64, device=dev)
        G = torch.zeros(K * I, K * I, **f64) if joint else torch.zeros(K, I, I, **f64)
        B = torch.zeros(K * I, d, **f64) if joint else torch.zeros(K, I, d, **f64)
        W0 = blk.experts.down_proj.data.transpose(1, 2).double()          # (K, I, d): y = a @ D^T
        cap = _Capture([blk], keep_output=False)
        try:
            for ids in batches:
                pruned(input_ids=ids)
                x = cap.x[0]
                target = moe.block_output(dblk, x).double()
                _, idx, w = moe.route(blk, x)
                phi = torch.zeros(x.shape[0], K, I, **f64)
                for e in torch.unique(idx).tolist():
                    t, m = torch.where(idx == e)
                    phi[t, e] += w[t, m].double().unsqueeze(-1) * moe.expert_hidden(blk, x[t], e).double()
                if joint:
                    flat = phi.reshape(x.shape[0], K * I)
                    G += flat.T @ flat
                    B += flat.T @ target
                else:
                    resid = target - torch.einsum("nki,kid->nd", phi, W0)
                    for e in range(K):
                        G[e] += phi[:, e].T @ phi[:, e]
                        B[e] += phi[:, e].T @ (resid + phi[:, e] @ W0[e])
        finally:
            cap.close()
        if joint:
            W = ridge_refit(G, B, W0.reshape(K * I, d), ridge).reshape(K, I, d)
        else:
            W = torch.stack([ridge_refit(G[e], B[e], W0[e], ridge) for e in range(K)])
        blk.experts.down_proj.data.copy_(W.transpose(1, 2).to(blk.experts.down_proj.dtype))
