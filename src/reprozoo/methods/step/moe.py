"""The MoE language model (transformers' Qwen3-MoE) and the mechanics of removing experts.

One Qwen3-MoE sparse block maps a token's hidden state x in R^d to

    p = softmax(W_r x) in R^E,     K(x) = top-k indices of p,     w_j = p_j / sum_{i in K} p_i
    y(x) = sum_{j in K(x)} w_j f_j(x),   f_j(x) = D_j (silu(G_j x) * (U_j x))            (SwiGLU expert)

(``norm_topk_prob=True``: the k gate values are renormalised, as in Qwen3-30B-A3B). transformers
stores the experts as 3-D tensors: ``experts.gate_up_proj`` (E, 2I, d) = [G_j; U_j] and
``experts.down_proj`` (E, d, I) = D_j; the router is ``gate.weight`` (E, d).

Pruning expert set P from a block keeps the rows K = {0..E-1} minus P of all three tensors. The
router's softmax then runs over the kept experts only, which is exactly the dense router with the
pruned logits set to -inf: every token re-routes to its best k kept experts. The kept tensors are
smaller in memory, which is where the paper's memory saving comes from (experts are ~95 % of
Qwen3-30B-A3B's parameters).
"""
from __future__ import annotations

import torch
from torch import nn


def build_config(cfg: dict):
    """A Qwen3-MoE config from the scale's ``model`` block (random initialisation, no weights)."""
    from transformers import Qwen3MoeConfig

    c = dict(cfg)
    return Qwen3MoeConfig(
        vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["moe_intermediate"],
        moe_intermediate_size=c["moe_intermediate"], num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"], head_dim=c["hidden"] // c["heads"],
        num_experts=c["experts"], num_experts_per_tok=c["top_k"], norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=c["seq_len"],
        # the library's own balance loss pools every layer's router (expert j of layer 0 and expert j
        # of layer 1 count as one expert), so it cannot balance a layer; it is switched off when the
        # per-layer Switch loss below is trained (``balance: per_layer``, the default)
        router_aux_loss_coef=c.get("aux_loss", 0.001) if c.get("balance", "per_layer") == "pooled" else 0.0,
        tie_word_embeddings=False)


def build_model(cfg: dict, seed: int) -> nn.Module:
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(build_config(cfg))


def switch_balance_loss(router_logits, top_k: int) -> torch.Tensor:
    """Switch Transformer's load-balancing loss (Fedus et al. 2022, eq. 4), per layer, mean over
    layers: for a layer with E experts and router probabilities p_t over tokens t,

        B = E * sum_j f_j P_j,   f_j = share of the layer's k routed slots that go to expert j,
                                 P_j = mean_t p_tj,

    which is 1 for a uniform router and E / k for one that always picks the same k experts. Each layer
    is balanced on its own (the library's ``load_balancing_loss_func`` pools the layers' routers)."""
    out = []
    for z in router_logits:
        p = torch.softmax(z.float(), dim=-1)
        E = p.shape[-1]
        idx = torch.topk(p, top_k, dim=-1).indices
        f = torch.zeros(E, dtype=p.dtype, device=p.device).index_add_(
            0, idx.reshape(-1), torch.ones(idx.numel(), dtype=p.dtype, device=p.device)) / idx.numel()
        out.append(E * (f * p.mean(0)).sum())
    return torch.stack(out).mean()


def training_loss(model: nn.Module, ids: torch.Tensor, cfg: dict) -> torch.Tensor:
    """The training objective: next-token cross-entropy + ``aux_loss`` x the router balance loss,
    the per-layer Switch loss (``balance: per_layer``, default) or the library's pooled one
    (``balance: pooled``, added by the library's forward)."""
    out = model(input_ids=ids, labels=ids, output_router_logits=True)
    if cfg.get("balance", "per_layer") == "pooled":
        return out.loss
    return out.loss + float(cfg.get("aux_loss", 0.0)) * switch_balance_loss(out.router_logits, model.config.num_experts_per_tok)


def moe_blocks(model: nn.Module) -> list[nn.Module]:
    """The sparse MoE blocks, in layer order (layers listed in ``mlp_only_layers`` have none)."""
    return [layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "experts")]


def route(block: nn.Module, x: torch.Tensor, extra: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router of one block on tokens x (N, d): full probabilities p (N, E), the indices of the
    top-(k + extra) experts (N, k + extra) and the renormalised top-k gate values w (N, k)."""
    # at least float32, as the library's router (float64 stays float64: exact tests)
    p = torch.softmax(nn.functional.linear(x, block.gate.weight).to(torch.promote_types(x.dtype, torch.float32)), dim=-1)
    top_p, idx = torch.topk(p, block.gate.top_k + extra, dim=-1)
    w = top_p[:, : block.gate.top_k]
    if block.gate.norm_topk_prob:
        w = w / w.sum(-1, keepdim=True)
    return p, idx, w


def expert_hidden(block: nn.Module, x: torch.Tensor, e: int) -> torch.Tensor:
    """SwiGLU hidden activation a_e(x) = silu(G_e x) * (U_e x) of expert e on tokens x: (N, I)."""
    g, u = nn.functional.linear(x, block.experts.gate_up_proj[e]).chunk(2, dim=-1)
    return block.experts.act_fn(g) * u


def outputs_at(block: nn.Module, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """f_{idx[t, m]}(x_t) for every token t and slot m: (N, M, d). Loops over the experts that
    occur (as the library's eager path does), so only routed (token, expert) pairs are computed."""
    out = x.new_zeros(*idx.shape, x.shape[-1])
    for e in torch.unique(idx).tolist():
        t, m = torch.where(idx == e)
        out[t, m] = nn.functional.linear(expert_hidden(block, x[t], e), block.experts.down_proj[e])
    return out


def block_output(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """y(x) of the block from the equations above (the library's forward, written out; tested)."""
    _, idx, w = route(block, x)
    return (w.unsqueeze(-1).to(x.dtype) * outputs_at(block, x, idx)).sum(1)


@torch.no_grad()
def prune_block(block: nn.Module, keep: list[int]) -> None:
    """Keep only experts ``keep`` (sorted) of the block: slice the router and the expert tensors."""
    keep_t = torch.as_tensor(sorted(keep), dtype=torch.long, device=block.gate.weight.device)
    if len(keep_t) < block.gate.top_k:
        raise ValueError(f"cannot keep {len(keep_t)} experts with top_k = {block.gate.top_k}")
    ex = block.experts
    ex.gate_up_proj = nn.Parameter(ex.gate_up_proj.data[keep_t].clone())
    ex.down_proj = nn.Parameter(ex.down_proj.data[keep_t].clone())
    block.gate.weight = nn.Parameter(block.gate.weight.data[keep_t].clone())
    ex.num_experts = block.gate.num_experts = len(keep_t)


def expert_param_count(model: nn.Module) -> int:
    return sum(b.experts.gate_up_proj.numel() + b.experts.down_proj.numel() for b in moe_blocks(model))


def param_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer: the model's weight memory (what must be loaded)."""
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
