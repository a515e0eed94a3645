"""TTFS framework in miniature: the ablation init -> +norm -> +decoder, and avg vs max pooling.

Variants (one cell = one variant x seed, trained on both datasets with the same budget):

    plain         PyTorch default init, no normalisation, final-potential decoder, avg pooling
    init          + the closed-form TTFS init (ttfs_net.ttfs_init_moments)
    init_norm     + final-potential batch normalisation (ttfs_net.FinalPotentialNorm)
    full          + the temporal output decoder: the paper's framework (avg pooling)
    full_maxpool  the full framework with max pooling instead of average pooling

Stages: train_shared (per seed) draws the digits split and the procedural glyph set, so every
variant sees the same images; train fits the SNN with Adam and cross-entropy for a fixed number
of epochs (same for all variants), records validation loss / accuracy per epoch and, on the test
split, accuracy, mean first-spike latency (time steps), firing fractions, spikes per neuron, the
most spikes any unit emitted, synaptic operations per example, and one example's raster.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import data as D

VARIANTS = {
    "plain": dict(init="default", norm=False, decoder="final", pool="avg"),
    "init": dict(init="ttfs", norm=False, decoder="final", pool="avg"),
    "init_norm": dict(init="ttfs", norm=True, decoder="final", pool="avg"),
    "full": dict(init="ttfs", norm=True, decoder="temporal", pool="avg"),
    "full_maxpool": dict(init="ttfs", norm=True, decoder="temporal", pool="max"),
}

# curves drawn generically (the raster and histograms are drawn by plot())
GENERIC_CURVES = {f"val_loss_{d}": ("training epoch", "validation cross-entropy (nats)") for d in ("digits", "glyphs")}


def _load_dataset(name: str, params: dict, rng: np.random.Generator) -> dict:
    if name == "digits":
        x, y = D.digits()
    elif name == "glyphs":
        x, y = D.glyphs(int(params["n_glyphs"]), rng)
    elif name in ("mnist", "fashion_mnist"):
        root = Path(params["data_root"]) / name
        xtr, ytr = D.mnist_idx(root, "train")
        xte, yte = D.mnist_idx(root, "test")
        out = D.split(xtr, ytr, rng, fractions=(0.9, 0.1))
        out.update(x_test=xte, y_test=yte)
        return out
    else:
        raise ValueError(f"ttfs: unknown dataset {name!r}; known: digits, glyphs, mnist, fashion_mnist")
    return D.split(x, y, rng)


def train_shared(ctx) -> None:
    """Per seed: the splits and the procedural set every variant trains on."""
    for i, name in enumerate(ctx.params["datasets"]):
        np.savez_compressed(ctx.shared_dir / f"{name}.npz", **_load_dataset(name, ctx.params, ctx.rng(i)))


def _fan_outs(net) -> list[int]:
    """Synapses one spike reaches: input -> conv1 (C1 * 9); a hidden neuron -> the next conv through
    its 2x2 pool (C_next * 9: avg pooling folds into those synapses with weight 1/4; with max pooling
    the pooled unit is the emitter and its spikes are counted instead); last layer -> fc (K).
    Border zero-padding is ignored (an upper bound)."""
    convs = list(net.convs)
    return [c.out_channels * 9 for c in convs] + [net.fc.out_features]


def fit_and_measure(name: str, arrays: dict, options: dict, params: dict, seed: int, metrics, progress) -> None:
    import torch
    import torch.nn.functional as F

    from ...blocks.spiking import synaptic_ops
    from .ttfs_net import TTFSNet, spike_statistics

    torch.manual_seed(seed)
    device = params.get("device", "cpu")  # `paper`: cuda
    t = {k: torch.from_numpy(v).to(device) for k, v in arrays.items()}
    xtr, ytr = t["x_train"], t["y_train"]
    T = int(params["T"])
    p_in = float((xtr > 0).float().mean())  # fraction of input pixels that fire (for the init)
    net = TTFSNet(tuple(xtr.shape[1:]), tuple(params["channels"]), 10, T, p_in=p_in,
                  kappa=params["kappa"], rho=params["rho"], surrogate_alpha=params["surrogate_alpha"], **options).to(device)
    with torch.no_grad():  # signal at initialisation: does the last hidden layer fire at all?
        st0 = spike_statistics(net(xtr[:256]), T)
    metrics.scalar(f"fire_frac_last_init_{name}", st0["fire_frac_last"])
    opt = torch.optim.Adam(net.parameters(), lr=params["lr"])
    epochs = int(params.get("epochs_by_dataset", {}).get(name, params["epochs"]))
    bs = int(params["batch"])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    gen = torch.Generator().manual_seed(seed)
    val_loss, val_acc, train_loss = [], [], []
    for ep in range(epochs):
        net.train()
        perm, tot = torch.randperm(len(xtr), generator=gen).to(device), 0.0
        for i in range(0, len(xtr) - bs + 1, bs):
            idx = perm[i:i + bs]
            loss = F.cross_entropy(net(xtr[idx])["logits"], ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += float(loss.detach()) * len(idx)
        sched.step()
        train_loss.append(tot / (len(xtr) // bs * bs))
        net.eval()
        with torch.no_grad():
            lg = net(t["x_val"])["logits"]
            val_loss.append(float(F.cross_entropy(lg, t["y_val"])))
            val_acc.append(float((lg.argmax(1) == t["y_val"]).float().mean()))
    progress(f"{name}: val acc {val_acc[-1]:.3f}, val loss {val_loss[-1]:.3f}")
    ep_x = list(range(1, epochs + 1))
    metrics.curve(f"val_loss_{name}", ep_x, val_loss)
    metrics.curve(f"val_acc_{name}", ep_x, val_acc)
    metrics.curve(f"train_loss_{name}", ep_x, train_loss)
    q = max(2, epochs // 4)  # final slope of the validation loss per epoch over the last quarter
    metrics.scalar(f"val_loss_final_slope_{name}", float(np.polyfit(ep_x[-q:], val_loss[-q:], 1)[0]))
    metrics.scalar(f"mean_val_acc_{name}", float(np.mean(val_acc)))  # area under the curve: speed
    metrics.scalar(f"train_loss_{name}", train_loss[-1])

    net.eval()
    with torch.no_grad():
        out = net(t["x_test"])
    metrics.scalar(f"acc_{name}", float((out["logits"].argmax(1) == t["y_test"]).float().mean()))
    out = {k: ([a.cpu() for a in v] if isinstance(v, list) else v.cpu()) for k, v in out.items()}
    st = spike_statistics(out, T)
    for k in ("latency", "fire_frac", "fire_frac_last", "spikes_per_neuron", "max_spikes_per_unit", "frac_multi_spike"):
        metrics.scalar(f"{k}_{name}", st[k])
    metrics.curve(f"latency_hist_{name}", list(range(T)), st["latency_hist"])
    metrics.curve(f"count_hist_{name}", list(range(5)), st["count_hist"])
    fo = _fan_outs(net)
    emitted = [out["input"]] + (out["spikes"] if options["pool"] == "avg" else out["sent"])
    sops = sum(synaptic_ops(s, f) for s, f in zip(emitted, fo)) / len(t["x_test"])
    metrics.scalar(f"sops_{name}", sops)
    # raster of test example 0: every spike of every emitting unit (hidden IF neurons, then max-pooled units)
    units = torch.cat([s[:, 0].flatten(1) for s in out["spikes"]] +
                      ([a[:, 0].flatten(1) for a in out["sent"]] if options["pool"] == "max" else []), dim=1)
    tt, uu = torch.nonzero(units > 0, as_tuple=True)
    ev = list(range(len(tt)))
    metrics.curve(f"raster_unit_{name}", ev, uu.tolist())
    metrics.curve(f"raster_time_{name}", ev, tt.tolist())
    metrics.scalar(f"n_hidden_{name}", sum(s[0, 0].numel() for s in out["spikes"]))


def train(ctx) -> None:
    if ctx.variant not in VARIANTS:
        raise ValueError(f"ttfs: unknown variant {ctx.variant!r}; known: {sorted(VARIANTS)}")
    for i, name in enumerate(ctx.params["datasets"]):
        path = Path(ctx.shared_dir) / f"{name}.npz"
        if path.exists():
            with np.load(path) as z:
                arrays = {k: z[k] for k in z.files}
        else:  # a cell run on its own: the same deterministic draw as train_shared
            arrays = _load_dataset(name, ctx.params, ctx.rng(i))
        fit_and_measure(name, arrays, VARIANTS[ctx.variant], ctx.params, ctx.seed, ctx.metrics, ctx.progress)


def plot(table, plots_dir: Path, params: dict) -> None:
    from .plots import draw_all

    draw_all(table, Path(plots_dir), params)
