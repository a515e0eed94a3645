"""TTFS framework in miniature: the ablation plain -> +init -> +norm -> +decoder, in a 4-layer network.

Variants (one cell = one variant x seed, trained on its data sets with the same rule):

    plain          PyTorch default init, no normalisation, final-potential readout, avg pooling
    init           + the closed-form TTFS init (ttfs_net.ttfs_init_moments)
    init_norm      + weight normalisation with learnable affine (ttfs_net.WNConv2d)
    full           + the temporal-weighting output decoder: the paper's framework (avg pooling)
    plain_shallow  plain at 2 layers, digits only  } the depth x init difference-in-differences of the
    init_shallow   init at 2 layers, digits only   } precondition of init_prevents_signal_diminishing

Every readout has one learnable output gain, and the temporal decoder is rescaled at construction
so that its initial logit scale equals the final-potential readout's (scale-neutral readouts).
Max pooling is no variant: that it breaks the single-spike rule holds by construction (a test).

Stages: train_shared (per seed) draws the digits split and the procedural glyph set, so every
variant sees the same images; train fits every variant by the shared rule
``blocks.fitting.fit_to_plateau`` (one learning-rate grid piloted on this seed's validation loss,
the best rate constant until the validation loss is flat at ``fit.flat_tol``, one drop to a tenth,
flat again). On the test split it records accuracy, three latencies per example (first-spike time
over the firing neurons, over all neurons with silent ones at T, and the output decision time),
firing fractions, spikes per neuron, the spikes of the sending units (max per unit, fraction above
one), synaptic operations per example, and one example's raster.
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
    # the precondition's references (depth x init difference-in-differences): plain and init at the
    # shallow depth of the earlier miniature (2 layers); only the digits claim reads them, so they train
    # on digits only
    "plain_shallow": dict(init="default", norm=False, decoder="final", pool="avg", shallow=True,
                          datasets=("digits",)),
    "init_shallow": dict(init="ttfs", norm=False, decoder="final", pool="avg", shallow=True,
                         datasets=("digits",)),
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


def fit_config(params: dict, dataset: str | None = None, variant: str | None = None) -> dict:
    """The shared training rule's keys (``blocks.fitting.fit_to_plateau``): ``params["fit"]``.

    With ``lr_fixed: {dataset: {variant: rate}}`` in the config the grid is replaced by that one rate
    (chosen once on validation by a one-seed run of the same rule over ``fit.lr_grid``: the selection
    grid stays in the config so that deleting ``lr_fixed`` reruns the selection). Returns the fit keys
    and, as ``_edge``, where the rate sits in the selection grid (``top``, ``bottom`` or None) and, as
    ``_fixed``, whether it is fixed (both to be popped before ``fit_to_plateau``)."""
    from ...blocks.rate_table import fit_with_table_rate

    grid = sorted(float(r) for r in params["fit"]["lr_grid"])
    fit, how = fit_with_table_rate(dict(params["fit"]), params.get("lr_fixed"), str(dataset), str(variant),
                                   required=False, where="lr_fixed")
    if how["lr_source"] == "table" and fit["lr_grid"][0] not in grid:
        raise ValueError(f"ttfs: lr_fixed[{dataset}][{variant}] = {fit['lr_grid'][0]} is not in fit.lr_grid {grid}")
    fit = dict(fit)
    fit["_edge"], fit["_fixed"] = how["lr_edge"], how["lr_source"] == "table"
    return fit


def fit_and_measure(name: str, arrays: dict, options: dict, params: dict, seed: int, metrics, progress,
                    variant: str | None = None) -> None:
    import torch
    import torch.nn.functional as F

    from ...blocks.fitting import fit_to_plateau
    from ...blocks.spiking import first_spike_time, synaptic_ops
    from .ttfs_net import TTFSNet, decision_time, spike_statistics, temporal_step_weights

    torch.manual_seed(seed)
    device = params.get("device", "cpu")  # `paper`: cuda
    t = {k: torch.from_numpy(v).to(device) for k, v in arrays.items()}
    xtr, ytr = t["x_train"], t["y_train"]
    T = int(params["T"])
    p_in = float((xtr > 0).float().mean())  # fraction of input pixels that fire (for the init)
    options = dict(options)
    options.pop("datasets", None)
    if options.pop("shallow", False):
        channels, pool_after = params["channels_shallow"], params.get("pool_after_shallow")
    else:
        channels, pool_after = params["channels"], params.get("pool_after")
    fit = fit_config(params, name, variant)
    fixed_edge, fixed = fit.pop("_edge"), fit.pop("_fixed")
    fit["select"], fit["stop_on"] = "loss", ["loss"]  # stop and keep on the validation loss
    calib = {}

    def build(gen):
        # the same initial weights for every rate of the grid (the generator is seeded with the seed)
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        net = TTFSNet(tuple(xtr.shape[1:]), tuple(channels), 10, T, p_in=p_in, kappa=params["kappa"],
                      rho=params["rho"], surrogate_alpha=params["surrogate_alpha"], pool_after=pool_after,
                      **options).to(device)
        calib["k"] = net.calibrate_decoder(xtr[:256])  # scale-neutral readout (1 for the final decoder)
        return net

    bs = int(params["batch"])

    def train_loss(net, gen):
        idx = torch.randint(0, len(xtr), (bs,), generator=gen).to(device)
        return F.cross_entropy(net(xtr[idx])["logits"], ytr[idx])

    def val_loss(net):
        with torch.no_grad():
            lg = net(t["x_val"])["logits"]
        return {"loss": float(F.cross_entropy(lg, t["y_val"])), "acc": float((lg.argmax(1) == t["y_val"]).float().mean())}

    net0 = build(torch.Generator().manual_seed(seed))
    with torch.no_grad():  # signal at initialisation: does the last hidden layer fire at all?
        st0 = spike_statistics(net0(xtr[:256]), T)
        lg0 = net0(xtr[:256])["logits"]
    metrics.scalar(f"fire_frac_last_init_{name}", st0["fire_frac_last"])
    metrics.scalar(f"logit_std_init_{name}", float(lg0.std()))
    metrics.scalar(f"decoder_scale_{name}", calib["k"])
    net, rec = fit_to_plateau(build, train_loss, val_loss, fit, seed, label=name, progress=progress)
    steps, vl, va = rec["steps"], rec["curves"]["loss"], rec["curves"]["acc"]
    progress(f"{name}: lr {rec['lr']:g}, {rec['stop']} steps, best val loss {min(vl):.3f}, "
             f"val acc at the kept weights {va[int(np.argmin(vl))]:.3f}")
    metrics.curve(f"val_loss_{name}", steps, vl)
    metrics.curve(f"val_acc_{name}", steps, va)
    metrics.curve(f"lr_{name}", steps, rec["lrs"])
    metrics.scalar(f"lr_peak_{name}", float(rec["lr"]))
    # where the rate sits in the selection grid (-1 bottom, 0 inside, +1 top): with a fixed rate, its
    # place in the grid it was chosen from; with the grid, the rule's own flag. Without a fixed rate the
    # pilot's score of every rate is recorded too (what the fixed rates were chosen from)
    edge = fixed_edge if fixed else rec.get("lr_edge")
    metrics.scalar(f"lr_edge_{name}", {"top": 1.0, "bottom": -1.0}.get(edge, 0.0))
    if not fixed and len(rec.get("pilot_best") or {}) > 1:
        pb = sorted(rec["pilot_best"].items())
        metrics.curve(f"lr_pilot_{name}", [float(np.log10(r)) for r, _ in pb], [float(v) for _, v in pb])
    metrics.scalar(f"steps_{name}", float(rec["stop"]))
    if rec.get("drop_gain") is not None:
        metrics.scalar(f"drop_gain_{name}", float(rec["drop_gain"]))
    losses = np.asarray(rec["losses"], float)
    k = int(fit["eval_every"])
    metrics.curve(f"train_loss_{name}", list(range(k, len(losses) + 1, k)),
                  [float(losses[i - k:i].mean()) for i in range(k, len(losses) + 1, k)])
    # training speed: mean validation accuracy over the evaluations up to the fixed ``speed_window``
    # (a config key outside the training budget, below min_steps: every fit trains through it)
    window = int(params["speed_window"])
    metrics.scalar(f"mean_val_acc_{name}", float(np.mean([a for s_, a in zip(steps, va) if s_ <= window])))
    # stability: spread of the training loss over the speed window's minibatches (per seed)
    metrics.scalar(f"train_loss_spread_{name}", float(np.std(np.diff(losses[:window]))))

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
    # first-spike latency per example, three readings: over the neurons that fire (confounded by how
    # many fire), with silent neurons counted as T, and the output decision time (the earliest step
    # from which the partial readout's argmax stays at the final prediction)
    per_ex = torch.where(fired.any(1), (tf * fired).sum(1) / fired.sum(1).clamp(min=1), torch.tensor(float(T)))
    metrics.units(f"latency_fired_{name}", per_ex.tolist())
    metrics.units(f"latency_all_{name}", tf.mean(1).tolist())
    dec = decision_time(out["partial"])
    metrics.units(f"decision_{name}", dec.tolist())
    # the decision time's floor: before the last hidden layer's first spike the output current is its
    # bias alone, so no decoder can decide on evidence earlier (a decision "before" it is the bias's
    # argmax agreeing with the final class). Per example: that onset step (T if the layer stays silent)
    onset = first_spike_time(out["spikes"][-1].flatten(2)).min(1).values
    metrics.units(f"decision_floor_{name}", onset.tolist())
    # anytime accuracy (cold review of 706c67a, F4): the partial readout's accuracy at every step, per
    # test example its mean over the steps (the area under the example's anytime curve, / T)
    correct_t = (out["partial"].argmax(2) == y_test.unsqueeze(0)).float()  # (T, B)
    metrics.units(f"anytime_acc_{name}", correct_t.mean(0).tolist())
    metrics.curve(f"anytime_acc_curve_{name}", list(range(T)), correct_t.mean(1).tolist())
    metrics.scalar(f"frac_decided_at_0_{name}", float((dec == 0).float().mean()))
    metrics.scalar(f"frac_decided_before_onset_{name}", float((dec < onset).float().mean()))
    # diagnostic: the decision time of the same trained network read through the temporal decoder's
    # step weights (for `full` its own readout): how much of a decision-time gain is the readout alone
    w_tw = temporal_step_weights(T).view(T, 1, 1)
    metrics.units(f"decision_tw_{name}", decision_time(torch.cumsum(w_tw * out["current"], 0)).tolist())
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
    only = VARIANTS[ctx.variant].get("datasets")
    for i, name in enumerate(ctx.params["datasets"]):
        if only is not None and name not in only:
            continue
        path = Path(ctx.shared_dir) / f"{name}.npz"
        if path.exists():
            with np.load(path) as z:
                arrays = {k: z[k] for k in z.files}
        else:  # a cell run on its own: the same deterministic draw as train_shared
            arrays = _load_dataset(name, ctx.params, ctx.rng(i))
        fit_and_measure(name, arrays, VARIANTS[ctx.variant], ctx.params, ctx.seed, ctx.metrics, ctx.progress,
                        variant=ctx.variant)


def plot(table, plots_dir: Path, params: dict) -> None:
    from .plots import draw_all

    draw_all(table, Path(plots_dir), params)
