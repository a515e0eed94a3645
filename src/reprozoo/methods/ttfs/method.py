"""TTFS framework in miniature: the ablation plain -> +init -> +norm -> +decoder.

Variants (one cell = one variant x seed, trained on both datasets with the same rule):

    plain      PyTorch default init, no normalisation, final-potential decoder, avg pooling
    init       + the closed-form TTFS init (ttfs_net.ttfs_init_moments)
    init_norm  + weight normalisation with learnable affine (ttfs_net.WNConv2d)
    full       + the temporal-weighting output decoder: the paper's framework (avg pooling)

Max pooling is no variant: that it breaks the single-spike rule holds by construction (a test).

Stages: train_shared (per seed) draws the digits split and the procedural glyph set, so every
variant sees the same images; train fits the SNN with Adam (cross-entropy, constant learning rate
chosen per variant from one grid on validation by ``lr_sweep.py``), validates every
``eval_every`` steps and stops at a plateau of the validation loss by the convergence gate's own
test (between ``min_steps`` and ``max_steps``, the same for all). On the test split it records
accuracy and mean first-spike latency per example (units of the claims), firing fractions, spikes
per neuron, the spikes of the sending units (max per unit, fraction above one), synaptic
operations per example, and one example's raster.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...claims import tail_fit
from . import data as D

PLATEAU_TOL = 0.02  # the convergence gate's tolerance (spec: convergence)

VARIANTS = {
    "plain": dict(init="default", norm=False, decoder="final", pool="avg"),
    "init": dict(init="ttfs", norm=False, decoder="final", pool="avg"),
    "init_norm": dict(init="ttfs", norm=True, decoder="final", pool="avg"),
    "full": dict(init="ttfs", norm=True, decoder="temporal", pool="avg"),
}

# curves drawn generically (the raster and histograms are drawn by plot())
GENERIC_CURVES = {f"val_loss_{d}": ("training step", "validation cross-entropy (nats)") for d in ("digits", "glyphs")}


def _load_dataset(name: str, params: dict, rng: np.random.Generator) -> dict:
    if name == "digits":
        x, y = D.digits()
    elif name == "glyphs":
        x, y = D.glyphs(int(params["n_glyphs"]), rng, noise=float(params.get("glyph_noise", 0.15)))
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


def lr_for(params: dict, variant: str, name: str) -> float:
    """The (constant) learning rate of ``variant`` on data set ``name``: ``lr_by_variant[variant][name]``
    when the config fixes it (chosen by ``lr_sweep.py`` from ``lr_grid`` on seed 0's validation
    split, the same grid for every variant), else the scalar ``lr``."""
    chosen = (params.get("lr_by_variant") or {}).get(variant, {})
    return float(chosen.get(name, params["lr"])) if isinstance(chosen, dict) else float(chosen)


def fit_and_measure(name: str, arrays: dict, options: dict, params: dict, seed: int, metrics, progress,
                    lr: float | None = None) -> None:
    import torch
    import torch.nn.functional as F

    from ...blocks.spiking import first_spike_time, synaptic_ops
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
    peak = float(params["lr"]) if lr is None else float(lr)
    opt = torch.optim.Adam(net.parameters(), lr=peak)  # constant rate: the plateau is shown at the peak rate
    bs = int(params["batch"])
    per_epoch = len(xtr) // bs
    every, min_steps, max_steps = int(params["eval_every"]), int(params["min_steps"]), int(params["max_steps"])
    gen = torch.Generator().manual_seed(seed)

    def validate():
        net.eval()
        with torch.no_grad():
            lg = net(t["x_val"])["logits"]
        net.train()
        return float(F.cross_entropy(lg, t["y_val"])), float((lg.argmax(1) == t["y_val"]).float().mean())

    steps, val_loss, val_acc, train_loss, lrs = [], [], [], [], []
    perm, pos, run, nrun, flat = None, per_epoch, 0.0, 0, 0
    net.train()
    for step in range(1, max_steps + 1):
        if pos >= per_epoch:
            perm, pos = torch.randperm(len(xtr), generator=gen).to(device), 0
        idx = perm[pos * bs:(pos + 1) * bs]
        pos += 1
        loss = F.cross_entropy(net(xtr[idx])["logits"], ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        run, nrun = run + float(loss.detach()), nrun + 1
        if step % every == 0 or step == max_steps:
            vl, va = validate()
            steps.append(step)
            val_loss.append(vl)
            val_acc.append(va)
            train_loss.append(run / nrun)
            lrs.append(peak)
            run, nrun = 0.0, 0
            # stop at a plateau by the gate's own test, seen at two evaluations in a row
            fit = tail_fit(steps, val_loss, "min", min_points=int(params.get("min_tail_points", 6)))
            flat = flat + 1 if step >= min_steps and fit["improvement"] <= PLATEAU_TOL else 0
            if flat >= 2:
                break
    progress(f"{name}: lr {peak:g}, {steps[-1]} steps, val acc {val_acc[-1]:.3f}, val loss {val_loss[-1]:.3f}")
    metrics.curve(f"val_loss_{name}", steps, val_loss)
    metrics.curve(f"val_acc_{name}", steps, val_acc)
    metrics.curve(f"train_loss_{name}", steps, train_loss)
    metrics.curve(f"lr_{name}", steps, lrs)
    metrics.scalar(f"lr_peak_{name}", peak)
    metrics.scalar(f"steps_{name}", steps[-1])
    # training speed: mean validation accuracy over the evaluations of the first min_steps, a window
    # every variant trains through (early stopping cannot lengthen or shorten it)
    metrics.scalar(f"mean_val_acc_{name}", float(np.mean([a for s_, a in zip(steps, val_acc) if s_ <= min_steps])))
    metrics.scalar(f"train_loss_{name}", train_loss[-1])

    net.eval()
    with torch.no_grad():
        out = net(t["x_test"])
    out = {k: ([a.cpu() for a in v] if isinstance(v, list) else v.cpu()) for k, v in out.items()}
    y_test = t["y_test"].cpu()
    # per test example (the units of the accuracy and latency claims; same order for every variant)
    metrics.units(f"acc_{name}", (out["logits"].argmax(1) == y_test).float().tolist())
    hidden = torch.cat([s.flatten(2) for s in out["spikes"]], dim=2)  # (T, B, N)
    tf = first_spike_time(hidden)
    fired = tf < T
    per_ex = torch.where(fired.any(1), (tf * fired).sum(1) / fired.sum(1).clamp(min=1), torch.tensor(float(T)))
    metrics.units(f"latency_{name}", per_ex.tolist())
    st = spike_statistics(out, T)
    for k in ("fire_frac", "fire_frac_last", "spikes_per_neuron", "max_spikes_per_unit", "frac_multi_spike"):
        metrics.scalar(f"{k}_{name}", st[k])
    metrics.scalar(f"latency_pooled_{name}", st["latency"])
    metrics.curve(f"latency_hist_{name}", list(range(T)), st["latency_hist"])
    metrics.curve(f"count_hist_{name}", list(range(5)), st["count_hist"])
    fo = _fan_outs(net)
    emitted = [out["input"]] + out["senders"]
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
        fit_and_measure(name, arrays, VARIANTS[ctx.variant], ctx.params, ctx.seed, ctx.metrics, ctx.progress,
                        lr=lr_for(ctx.params, ctx.variant, name))


def plot(table, plots_dir: Path, params: dict) -> None:
    from .plots import draw_all

    draw_all(table, Path(plots_dir), params)
