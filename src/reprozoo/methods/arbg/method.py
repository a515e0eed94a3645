"""ArBG in miniature: an autoregressive Boltzmann generator against a spline flow and a CNF.

Variants (same data, same optimiser, learning-rate grid, schedule, steps and batch; comparable
parameter counts):
  arbg  - discretised coordinates, causal transformer, uniform dequantisation (the paper's method)
  flow  - neural spline flow over all coordinates (discrete-time BG baseline)
  cnf   - flow-matching continuous normalizing flow, exact-divergence likelihood (continuous-time BG)

Stages.
  train_shared (per seed): for every target in ``targets`` (dw4 at smoke; dw4 and lj13 at paper),
    MALA samples of the exact Boltzmann density (shared block) from three disjoint sets of chains
    (train / validation / test), training set augmented by symmetry images (data.py), saved as
    ``<target>.pt``.
  train (per variant x seed): maximum likelihood (flow matching for the CNF) with Adam; the peak
    learning rate is the one ``lr_sweep.py`` chose on the validation split from ``train.lr_grid``
    (``train.lr``; without it, the grid is halved on validation inside the cell, :func:`fit`); the
    schedule warms up, holds, anneals to a floor (0.15 x peak at smoke) and stays there
    (:func:`lr_factor`); validation and learning-rate curves every ``eval_every`` steps (the
    convergence gate reads both). Then ``n_samples`` proposal samples with their exact log q, log
    importance weights log w = -E(x)/T - log q(y), and the metrics:
      ess_<t>      normalised Kish ESS of all n weights (1 = perfect proposal, 1/n = one sample counts);
                   n_eff_<t> = n x ESS
      ess_a_<t>, ess_b_<t>  the same ESS on two disjoint halves of the n samples (noise check)
      ew2_crop_<t> E-W2 (energy units of the target, k_B T = 1) between proposal and test reference
                   energies, both clipped to [-crop, crop] (AutoBG's cropped E-W2, crop 1000)
      ew2_crop_ref_<t>  the same with the upper clip at max(E_ref) + ref_crop_margin (our variant)
      ew2_bulk_<t> E-W2 of the proposal samples at or below max(E_ref) against the reference
      ew2_ref_floor_<t>  E-W2 between the two chain-disjoint halves of the reference (its noise)
      *_early_<t>  ESS and E-W2 of the ArBG early checkpoint (``early_fraction`` of the steps),
                   the claims' declared controls
      ew2_rw_<t>   E-W2 of the importance-weighted proposal (top 0.2 % of log weights dropped first,
                   AutoBG's clip_reweighting_logits), weights used exactly instead of resampling
      ew2_<t>      E-W2 of the proposal with no crop (a diagnostic: a handful of tail samples set it)
      frac_above_ref_max_<t>, frac_above_crop_<t>  share of proposal samples above the highest
                   test energy / above the crop
      nll_<t>      -mean log q(y) of held-out test samples (nats, free coordinates)
      ehist_*_<t>  energy histograms (density per energy unit) on a fixed grid, for the plots.
Energies are the target's exact energies, evaluated in float64 on the full COM-free configuration.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
from reprozoo.figures import save_figure

VARIANTS = ("arbg", "flow", "cnf")


def _target(name: str):
    from ...blocks.boltzmann import make_target

    return make_target(name)


# --- shared per-seed work ----------------------------------------------------------------------

def train_shared(ctx) -> None:
    import torch

    from .data import make_dataset

    p = ctx.params
    for k, name in enumerate(p["targets"]):
        tgt = _target(name)
        gen = torch.Generator().manual_seed(ctx.seed * 1_000_003 + 17 + k)
        t0 = time.process_time()
        data = make_dataset(tgt, p["data"]["n_train"], p["data"]["n_val"], p["data"]["n_test"], p["data"]["augment"],
                            gen, p["data"]["mala"])
        ctx.metrics.scalar(f"mala_seconds_{name}", time.process_time() - t0)
        ctx.metrics.scalar(f"mala_accept_{name}", float(data["accept"].mean()))
        ctx.progress(f"{name}: {len(data['y_train'])} train (augmented), {len(data['y_val'])} validation, "
                     f"{len(data['y_test'])} test samples, "
                     f"MALA acceptance {float(data['accept'].mean()):.3f}")
        torch.save(data, ctx.outdir / f"{name}.pt")


# --- per variant -------------------------------------------------------------------------------

def lr_factor(step: int, steps: int, sched: dict) -> float:
    """Learning-rate multiplier at ``step`` of ``steps``: linear warm-up over the first ``warmup``
    fraction, constant 1 until ``hold``, a cosine from 1 down to ``floor`` between ``hold`` and
    ``anneal_end``, then constant at ``floor``. The floor (0.15 at smoke) keeps the rate above a
    tenth of its peak in the last 30 % of training, so a flat validation curve there is a plateau
    at a live learning rate, not a schedule that ran out."""
    u = step / steps
    w, hold, end, floor = (float(sched.get(k, d)) for k, d in
                           (("warmup", 0.02), ("hold", 0.35), ("anneal_end", 0.6), ("floor", 0.15)))
    if w > 0 and u < w:
        return min(1.0, step / (w * steps))
    if u <= hold:
        return 1.0
    if u < end:
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (u - hold) / (end - hold)))
    return floor


def fit(model, y_train, y_val, steps: int, batch: int, lr_grid, sched: dict, eval_every: int, pilot_rungs,
        generator, val_fn, progress=print, snapshot_at: int | None = None):
    """Adam on the model's own loss with the schedule of :func:`lr_factor`, the peak learning rate
    chosen on the VALIDATION split from ``lr_grid`` by successive halving: every grid value trains
    a copy of the same initial model on the same batches; at each rung (fractions of ``steps`` in
    ``pilot_rungs``) the better half of the surviving copies (by validation loss, mean of the last
    three evaluations) goes on, and after the last rung only the best one, which continues to
    ``steps``. Every variant gets the same grid, rungs and schedule.

    The returned model is the BEST VALIDATION CHECKPOINT of the chosen run (the parameters at the
    evaluation with the lowest validation loss), so a curve that rises again at the end does not
    hand its worse end state to the evaluation; ``val_rise`` (last minus lowest validation loss)
    and ``best_step`` record how far the end lies from it. ``snapshot_at`` (a step) keeps a copy of
    the parameters at that step too (``record["snapshot"]``, a state dict): the early checkpoint of
    the controls.

    Returns ``(model, record)``: the trained copy and its train-loss curve (mean over each window of
    ``eval_every`` steps), validation curve, learning-rate curve (at the evaluation steps), the
    chosen peak rate and, per grid value, its validation loss at the last rung it reached."""
    import copy

    import torch

    lr_grid = [float(v) for v in (lr_grid if isinstance(lr_grid, (list, tuple)) else [lr_grid])]
    rungs = [pilot_rungs] if isinstance(pilot_rungs, (int, float)) else list(pilot_rungs)
    rung_steps = sorted({max(eval_every, int(round(float(f) * steps / eval_every)) * eval_every) for f in rungs})
    state0 = generator.get_state()

    def make(lr):
        m = copy.deepcopy(model)
        g = torch.Generator(device=generator.device)
        g.set_state(state0.clone())
        return {"model": m, "lr": lr, "opt": _adam(m.parameters(), lr), "gen": g, "step": 0,
                "window": [], "tr": [], "va": [], "lr_curve": [], "score": float("nan"),
                "best": (float("inf"), 0, None), "snapshot": None}

    def advance(r, until):
        m, opt, g, n = r["model"], r["opt"], r["gen"], len(y_train)
        m.train()
        while r["step"] < until:
            r["step"] += 1
            step = r["step"]
            cur = r["lr"] * lr_factor(step, steps, sched)
            for group in opt.param_groups:
                group["lr"] = cur
            idx = torch.randint(0, n, (min(batch, n),), generator=g, device=y_train.device)
            loss = m.loss(y_train[idx], g) if _takes_generator(m) else m.loss(y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            r["window"].append(float(loss.detach()))
            if snapshot_at is not None and step == snapshot_at:
                r["snapshot"] = copy.deepcopy(m.state_dict())
            if step % eval_every == 0 or step == steps:
                m.eval()
                with torch.no_grad():
                    v = float(val_fn(m, y_val))
                m.train()
                r["tr"].append((step, float(np.mean(r["window"]))))
                r["va"].append((step, v))
                r["lr_curve"].append((step, cur))
                r["window"] = []
                if math.isfinite(v) and v < r["best"][0]:
                    r["best"] = (v, step, copy.deepcopy(m.state_dict()))
                if step % (10 * eval_every) == 0 or step == steps:
                    progress(f"lr {r['lr']:g} step {step}/{steps}: train {r['tr'][-1][1]:.4f} val {v:.4f}")

    def score(r):
        tail = [v for _, v in r["va"][-3:]]
        return float(np.mean(tail)) if tail and all(math.isfinite(v) for v in tail) else float("inf")

    runs = [make(lr) for lr in lr_grid]
    alive = list(runs)
    for k, until in enumerate(rung_steps):
        if len(alive) == 1:
            break
        for r in alive:
            advance(r, until)
            r["score"] = score(r)
        alive.sort(key=lambda r: r["score"])
        keep = 1 if k == len(rung_steps) - 1 else max(1, math.ceil(len(alive) / 2))
        progress(f"rung {k + 1} (step {until}) validation loss per peak lr: "
                 + ", ".join(f"{r['lr']:g}: {r['score']:.4f}" for r in alive) + f" -> keep {keep}")
        alive = alive[:keep]
    best = alive[0]
    advance(best, steps)
    v_min, step_min, state = best["best"]
    if state is not None:
        best["model"].load_state_dict(state)
    best["model"].eval()
    return best["model"], {"train": best["tr"], "val": best["va"], "lr": best["lr_curve"], "lr_peak": best["lr"],
                           "pilot_steps": rung_steps, "pilot_val": [(r["lr"], r["score"]) for r in runs],
                           "best_step": step_min, "val_rise": float(best["va"][-1][1] - v_min) if best["va"] else 0.0,
                           "snapshot": best["snapshot"]}


def _adam(params, lr: float):
    """Adam (torch defaults) with the fused kernel where torch has one: the same update in fewer
    kernel launches, which matters for models this small on a CPU. Every variant uses it."""
    import torch

    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr)


def _takes_generator(model) -> bool:
    from .models import CNF

    return isinstance(model, CNF)


def _val_loss(model, y_val):
    """Validation objective of the model's own training loss on held-out samples (fixed noise)."""
    import torch

    from .models import CNF

    if isinstance(model, CNF):
        return model.loss(y_val, torch.Generator(device=y_val.device).manual_seed(0))
    return model.loss(y_val)


def final_slope(curve: list[tuple[int, float]]) -> float:
    """Change of the validation loss per 1000 steps over the last third of training (flatness)."""
    if len(curve) < 3:
        return float("nan")
    xs, ys = np.array(curve, dtype=float).T
    keep = xs >= xs[-1] - (xs[-1] - xs[0]) / 3
    return float(np.polyfit(xs[keep], ys[keep], 1)[0] * 1000) if keep.sum() >= 2 else float("nan")


def energy_histogram(e, lo: float, hi: float, bins: int, weights=None):
    """Density per energy unit on a fixed grid (so seeds and variants align); out-of-range mass is
    dropped from the plot, not from the metrics."""
    e = np.asarray(e, dtype=float)
    w = None if weights is None else np.asarray(weights, dtype=float)
    keep = np.isfinite(e)
    if w is not None:
        keep &= np.isfinite(w)
        w = w[keep] / w[keep].sum()
    else:
        w = np.full(int(keep.sum()), 1.0 / max(int(keep.sum()), 1))
    h, edges = np.histogram(e[keep], bins=bins, range=(lo, hi), weights=w)
    return 0.5 * (edges[1:] + edges[:-1]), h / (edges[1] - edges[0])


def trim_top_log_weights(log_w, frac: float) -> np.ndarray:
    """The authors' guard against a few runaway weights before reweighting (AutoBG's
    ``clip_reweighting_logits``, 0.002 in their configs): log weights above the (1 - frac) quantile
    are dropped (set to -inf); non-finite ones count as -inf. ``frac = 0`` keeps all."""
    lw = np.asarray(log_w, dtype=float)
    lw = np.where(np.isfinite(lw), lw, -np.inf)
    fin = np.isfinite(lw)
    if frac > 0 and fin.sum() > 1:
        thr = np.quantile(lw[fin], 1.0 - frac)
        lw = np.where(lw > thr, -np.inf, lw)
    return lw


def cropped_energy_w2(e_model, e_ref, crop: float, cap: float | None = None) -> float:
    """E-W2 on energies clipped to [-crop, crop], both sets (AutoBG's ``cropped_energy_w2``, crop
    1000): a sample far up the proposal's tail then counts at the crop, not at its own energy.
    ``cap`` (if given) replaces the upper bound: the reference-relative crop of
    :func:`evaluate` (highest reference energy + ``ref_crop_margin``), our named variant of the
    authors' rule."""
    from ...blocks import gen_metrics as M

    hi = crop if cap is None else cap
    em = np.asarray(e_model, dtype=float)
    em = np.clip(em[np.isfinite(em)], -crop, hi)
    return M.energy_w2(em, np.clip(np.asarray(e_ref, dtype=float), -crop, hi))


def bulk_energy_w2(e_model, e_ref) -> tuple[float, float]:
    """(E-W2 of the proposal samples at or below the highest reference energy against the
    reference, share of proposal samples above it): the bulk of the proposal, with the tail's
    share reported beside it instead of inside it. A proposal with no sample in the reference's
    range (an untrained model) has no bulk; it then counts as a point mass at the highest
    reference energy, the worst bulk there is, so the metric stays finite and large."""
    from ...blocks import gen_metrics as M

    em, er = np.asarray(e_model, dtype=float), np.asarray(e_ref, dtype=float)
    keep = np.isfinite(em) & (em <= er.max())
    share_above = float(1.0 - keep.mean())
    bulk = em[keep] if keep.sum() > 0 else np.array([er.max()])
    return M.energy_w2(bulk, er), share_above


def short_pair_share(x_full: "torch.Tensor", target) -> float:
    """Share of particle pairs in the inner well of the pair potential (d < d0): the slow,
    metastable coordinate of DW4, whose balance a reference must get right."""
    from ...blocks.boltzmann import pair_distances

    d0 = getattr(target, "d0", None)
    if d0 is None:
        return float("nan")
    return float((pair_distances(x_full, target.n_particles, target.spatial_dim) < d0).double().mean())


def sample_proposal(model, n_samples: int, generator, chunk: int = 5000):
    """``n_samples`` proposal samples with their exact log q, drawn in chunks (CPU tensors)."""
    import torch

    model.eval()
    with torch.no_grad():
        ys, lqs = zip(*(model.sample_and_log_prob(min(chunk, n_samples - i), generator)
                        for i in range(0, n_samples, chunk)))
    return torch.cat(ys).cpu(), torch.cat(lqs).cpu()


def evaluate(model, target, y_test, n_samples: int, generator, hist_range, crop: float = 1000.0,
             trim: float = 0.002, chunk: int = 5000, ref_half=None, ref_crop_margin: float = 10.0,
             with_nll: bool = True):
    """Sample the proposal (in chunks), weight it against the exact Boltzmann density, compute
    the metrics (energies and weights in float64 on the CPU). ``ref_half`` (0 / 1 per reference
    sample, disjoint chains) gives the reference's own E-W2 noise floor."""
    import torch

    from ...blocks import gen_metrics as M
    from .data import to_full

    n, d = target.n_particles, target.spatial_dim
    t0 = time.process_time()
    y, log_q = sample_proposal(model, n_samples, generator, chunk)
    sample_s = time.process_time() - t0
    with torch.no_grad():
        e_model = target.energy(to_full(y.double(), n, d))
        x_ref = to_full(y_test.cpu().double(), n, d)
        e_ref = target.energy(x_ref)
        log_w = M.log_importance_weights(-e_model / target.temperature, log_q.double())
        lw = trim_top_log_weights(log_w, trim)
        w = np.exp(lw - lw.max())
    half = len(log_w) // 2
    ess = M.kish_ess(log_w)
    cap = float(e_ref.max()) + ref_crop_margin
    ew2_bulk, above_ref = bulk_energy_w2(e_model.numpy(), e_ref.numpy())
    out = {
        "ess": ess,                       # all n weights, untrimmed
        "ess_a": M.kish_ess(log_w[:half]),   # two disjoint halves of the same n samples
        "ess_b": M.kish_ess(log_w[half:]),
        "n_eff": ess * len(log_w),        # effective number of samples behind the reweighted metrics
        "ew2": M.energy_w2(e_model, e_ref),                   # proposal, no crop (tail-dominated)
        "ew2_crop": cropped_energy_w2(e_model, e_ref, crop),  # proposal, energies clipped (authors, +-1000)
        "ew2_crop_ref": cropped_energy_w2(e_model, e_ref, crop, cap=cap),  # clipped at max E_ref + margin
        "ew2_bulk": ew2_bulk,                                 # proposal samples below max E_ref
        "ew2_rw": M.energy_w2(e_model, e_ref, weights=w),     # reweighted (top log weights trimmed)
        "mean_energy": float(e_model[torch.isfinite(e_model)].mean()),
        "mean_energy_rw": float(np.sum(w * np.nan_to_num(e_model.numpy())) / w.sum()),
        "ref_mean_energy": float(e_ref.mean()),
        "ref_max_energy": float(e_ref.max()),
        # share of proposal samples above every reference energy, and above the two crops
        "frac_above_ref_max": above_ref,
        "frac_above_crop": float((~(e_model <= crop)).double().mean()),
        "frac_above_crop_ref": float((~(e_model <= cap)).double().mean()),
        "sample_seconds": sample_s,
    }
    if ref_half is not None:
        h = torch.as_tensor(ref_half).bool()
        out["ew2_ref_floor"] = M.energy_w2(e_ref[~h], e_ref[h])
        out["ref_short_pair_a"] = short_pair_share(x_ref[~h], target)
        out["ref_short_pair_b"] = short_pair_share(x_ref[h], target)
    out["ref_short_pair"] = short_pair_share(x_ref, target)
    if with_nll:
        with torch.no_grad():
            lq_test = torch.cat([model.log_prob(y_test[i:i + chunk].float()).double().cpu()
                                 for i in range(0, len(y_test), chunk)])
        out["nll"] = M.nll(lq_test)
        out["test_outside_support"] = float((~torch.isfinite(lq_test)).double().mean())
    lo, hi, nb = hist_range
    hists = {"ehist_model": energy_histogram(e_model.numpy(), lo, hi, nb),
             "ehist_rw": energy_histogram(e_model.numpy(), lo, hi, nb, weights=w),
             "ehist_ref": energy_histogram(e_ref.numpy(), lo, hi, nb)}
    return out, hists


def cnf_ode_error(model, n: int, generator) -> float:
    """Discretisation error of the CNF's proposal log-likelihood, where the importance weights use
    it: the same ``n`` base draws z_0 are integrated noise -> data with the configured number of
    RK4 steps and with twice as many; mean |log q| difference (nats)."""
    import copy

    import torch

    fine = copy.deepcopy(model)
    fine.ode_steps = 2 * model.ode_steps
    state = generator.get_state()
    g2 = torch.Generator(device=generator.device)
    g2.set_state(state.clone())
    with torch.no_grad():
        _, lq = model.sample_and_log_prob(n, generator)
        _, lq_fine = fine.sample_and_log_prob(n, g2)
    return float((lq - lq_fine).abs().mean())


def intervention(model, target, y_test, n_prefixes: int, n_per_prefix: int, generator):
    """Sequential inference-time intervention (ArBG only): condition on the first particle's
    position, taken from ``n_prefixes`` held-out reference configurations, and sample the other
    coordinates from the model's exact conditional q(rest | prefix). Importance weights against the
    target restricted to that prefix: log w = -E(x)/T - log q(rest | prefix)."""
    import torch

    from ...blocks import gen_metrics as M
    from .data import to_full

    n, d = target.n_particles, target.spatial_dim
    idx = torch.linspace(0, len(y_test) - 1, n_prefixes).round().long()
    errs, energies, ess = [], [], []
    model.eval()
    for i in idx.tolist():
        prefix = y_test[i, :d]
        y, lq = model.sample_conditional(prefix, n_per_prefix, generator)
        y, lq = y.cpu().double(), lq.cpu().double()
        errs.append(float((y[:, :d] - prefix.cpu().double()).abs().max()))
        e = target.energy(to_full(y, n, d))
        energies.append(e[torch.isfinite(e)])
        ess.append(M.kish_ess(M.log_importance_weights(-e / target.temperature, lq)))
    e_all = torch.cat(energies)
    return {"intervention_prefix_err": max(errs),
            "intervention_half_bin": float(model.delta * model.scale) / 2,
            "intervention_energy_mean": float(e_all.mean()),
            "intervention_ess": float(np.mean(ess))}


def peak_lrs(tp: dict, variant: str) -> list[float]:
    """The peak learning rate(s) a variant trains with: ``train.lr[variant]`` where the scale's
    config fixes it (the choice of ``lr_sweep.py``: full-length runs of every ``lr_grid`` value on
    seed 0's validation split), else the whole ``train.lr_grid``, halved on validation inside the
    cell (:func:`fit`)."""
    lr = tp.get("lr")
    if isinstance(lr, dict):
        if variant not in lr:
            raise KeyError(f"train.lr has no rate for variant {variant!r}")
        return [float(lr[variant])]
    if lr is not None:
        return [float(lr)]
    return [float(x) for x in tp["lr_grid"]]


def fit_shared(variant: str, y_train, y_val, scale: float, p: dict, seed: int, early: int | None,
               progress=print):
    """Train ``variant`` with :func:`reprozoo.blocks.fitting.fit_to_plateau` (config ``fit``: the same
    learning-rate grid, pilot length, plateau tolerance and step cap for every variant; minibatches
    of ``fit.batch`` drawn with replacement; validation = the model's own loss on the validation
    split, :func:`_val_loss`). ``early`` (a step): keep the chosen run's parameters after that many
    updates (``record["snapshot"]``), the controls' early checkpoint. Returns ``(model, record)``
    in the form :func:`fit` returns (``train`` / ``val`` / ``lr`` curves as (step, value) pairs)."""
    import copy

    import torch

    from ...blocks.fitting import fit_to_plateau
    from .models import build

    fp = p["fit"]
    batch, n = int(fp["batch"]), len(y_train)
    counts, snaps = {}, {}

    def make(gen):
        torch.manual_seed(seed)              # the same initial weights for every rate
        return build(variant, y_train.shape[1], scale, p).to(y_train.device)

    def train_loss(model, gen):
        idx = torch.randint(0, n, (min(batch, n),), generator=gen).to(y_train.device)
        counts[id(model)] = counts.get(id(model), 0) + 1
        if early is not None and counts[id(model)] == early + 1:   # parameters after `early` updates
            snaps[id(model)] = copy.deepcopy(model.state_dict())
        if _takes_generator(model):
            if y_train.device.type != "cpu":   # the CNF's noise is drawn on the data's device
                gen = torch.Generator(device=y_train.device).manual_seed(
                    int(torch.randint(0, 2**62, (1,), generator=gen)))
            return model.loss(y_train[idx], gen)
        return model.loss(y_train[idx])

    def val_loss(model):
        with torch.no_grad():
            return float(_val_loss(model, y_val))

    model, rec = fit_to_plateau(make, train_loss, val_loss, fp, seed, label=variant, progress=progress)
    model.eval()
    vals = list(zip(rec["steps"], rec["vals"]))
    every = int(fp["eval_every"])
    tr = [(s, float(np.mean(rec["losses"][max(0, s - every):s]))) for s in rec["steps"] if s > 0]
    i_best = int(np.argmin(rec["vals"]))
    return model, {"train": tr, "val": vals, "lr": list(zip(rec["steps"], rec["lrs"])), "lr_peak": rec["lr"],
                   "pilot_val": sorted(rec["pilot_best"].items()), "best_step": rec["steps"][i_best],
                   "val_rise": float(rec["vals"][-1] - rec["vals"][i_best]), "snapshot": snaps.get(id(model)),
                   "stop": rec["stop"], "plateau": rec["plateau"]}


def train(ctx) -> None:
    import torch

    from .models import build, n_params

    p, v = ctx.params, ctx.variant
    if v not in VARIANTS:
        raise ValueError(f"unknown variant {v!r}; this method has {VARIANTS}")
    tp, ep = p.get("train", {}), p["eval"]
    device = torch.device(p.get("device", "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("config asks for device 'cuda' but torch sees no GPU; run the paper scale on a GPU "
                           "node or override device=cpu")
    for k, name in enumerate(p["targets"]):
        data = torch.load(ctx.shared_dir / f"{name}.pt", weights_only=True)
        tgt = _target(name)
        y_tr, y_va, y_te = (data[key].float().to(device) for key in ("y_train", "y_val", "y_test"))
        torch.manual_seed(ctx.seed * 7919 + k)
        model = build(v, y_tr.shape[1], float(data["scale"]), p).to(device)
        ctx.metrics.scalar(f"n_params_{name}", n_params(model))
        gen = torch.Generator(device=device).manual_seed(ctx.seed * 1_000_003 + 101 + k)
        t0 = time.process_time()
        if "fit" in p:
            # the platform's shared rule (blocks.fitting.fit_to_plateau): one grid piloted on
            # validation, the best rate continued at a constant rate until the plateau test holds
            early = int(ep["early_step"]) if v == "arbg" else None
            model, rec = fit_shared(v, y_tr, y_va, float(data["scale"]), p, ctx.seed * 7919 + k, early,
                                    progress=lambda m: ctx.progress(f"{name} {m}"))
        else:
            early = int(round(float(ep.get("early_fraction", 0.1)) * tp["steps"])) if v == "arbg" else None
            model, rec = fit(model, y_tr, y_va, tp["steps"], tp["batch"], peak_lrs(tp, v), tp.get("schedule", {}),
                             tp["eval_every"], tp.get("pilot_rungs", [0.05, 0.15]), gen, _val_loss,
                             progress=lambda m: ctx.progress(f"{name} {m}"), snapshot_at=early)
        ctx.metrics.scalar(f"train_seconds_{name}", time.process_time() - t0)
        ctx.metrics.scalar(f"best_step_{name}", rec["best_step"])
        ctx.metrics.scalar(f"val_rise_{name}", rec["val_rise"])
        ctx.metrics.curve(f"train_loss_{name}", *zip(*rec["train"]))
        ctx.metrics.curve(f"val_loss_{name}", *zip(*rec["val"]))
        ctx.metrics.curve(f"lr_{name}", *zip(*rec["lr"]))
        finite = [(lr, val) for lr, val in rec["pilot_val"] if math.isfinite(val)]
        if finite:
            ctx.metrics.curve(f"pilot_val_{name}", *zip(*finite))
        ctx.metrics.scalar(f"pilot_diverged_{name}", sum(math.isinf(val) for _, val in rec["pilot_val"]))
        ctx.metrics.scalar(f"lr_peak_{name}", rec["lr_peak"])
        ctx.metrics.scalar(f"val_slope_per_1k_{name}", final_slope(rec["val"]))
        if "stop" in rec:
            ctx.metrics.scalar(f"steps_{name}", float(rec["stop"]))
            ctx.metrics.scalar(f"plateau_{name}", float(rec["plateau"]))
        eval_kw = dict(crop=float(ep.get("energy_crop", 1000.0)), trim=float(ep.get("trim_log_weights", 0.002)),
                       ref_crop_margin=float(ep.get("ref_crop_margin", 10.0)))
        out, hists = evaluate(model, tgt, y_te, ep["n_samples"],
                              torch.Generator(device=device).manual_seed(ctx.seed * 1_000_003 + 202 + k),
                              p["energy_hist"][name], ref_half=data["test_half"], **eval_kw)
        for key, val in out.items():
            ctx.metrics.scalar(f"{key}_{name}", val)
        for key, (xs, ys) in hists.items():
            ctx.metrics.curve(f"{key}_{name}", xs, ys)
        if v == "cnf":
            ctx.metrics.scalar(f"ode_logq_err_{name}", cnf_ode_error(
                model, 256, torch.Generator(device=device).manual_seed(ctx.seed * 1_000_003 + 404 + k)))
        if early is not None and rec["snapshot"] is not None:
            # the controls' early checkpoint: the same ArBG after ``early_fraction`` of its steps,
            # evaluated exactly like the trained one (same n, same sampling seed)
            model_early = build(v, y_tr.shape[1], float(data["scale"]), p).to(device)
            model_early.load_state_dict(rec["snapshot"])
            oe, _ = evaluate(model_early, tgt, y_te, ep["n_samples"],
                             torch.Generator(device=device).manual_seed(ctx.seed * 1_000_003 + 202 + k),
                             p["energy_hist"][name], with_nll=False, **eval_kw)
            for key in ("ess", "ess_a", "ess_b", "ew2_crop_ref", "ew2_bulk", "ew2_rw", "frac_above_ref_max"):
                ctx.metrics.scalar(f"{key}_early_{name}", oe[key])
            ctx.metrics.scalar(f"early_step_{name}", early)
            ctx.progress(f"{name}: early checkpoint (step {early}) ESS {oe['ess']:.4f}, E-W2 crop_ref "
                         f"{oe['ew2_crop_ref']:.3f}, bulk {oe['ew2_bulk']:.3f}, reweighted {oe['ew2_rw']:.3f}")
        if v == "arbg":
            iv = p.get("intervention", {})
            iout = intervention(model, tgt, y_te, int(iv.get("n_prefixes", 4)), int(iv.get("n_per_prefix", 256)),
                                torch.Generator(device=device).manual_seed(ctx.seed * 1_000_003 + 303 + k))
            iout["intervention_energy_mean_uncond"] = out["mean_energy"]
            for key, val in iout.items():
                ctx.metrics.scalar(f"{key}_{name}", val)
            ctx.progress(f"{name}: intervention (first particle fixed) prefix err {iout['intervention_prefix_err']:.3g} "
                         f"<= {iout['intervention_half_bin']:.3g}, ESS {iout['intervention_ess']:.4f}")
        ctx.progress(f"{name}: ESS {out['ess']:.4f} (halves {out['ess_a']:.4f} / {out['ess_b']:.4f}, n_eff "
                     f"{out['n_eff']:.0f}), E-W2 {out['ew2']:.3f} (cropped {out['ew2_crop']:.3f}, crop at ref max "
                     f"+ margin {out['ew2_crop_ref']:.3f}, bulk {out['ew2_bulk']:.3f} with "
                     f"{100 * out['frac_above_ref_max']:.2f} % above, reweighted {out['ew2_rw']:.3f}; reference "
                     f"floor {out.get('ew2_ref_floor', float('nan')):.3f}), NLL {out['nll']:.3f}")


# --- plots ---------------------------------------------------------------------------------------

def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot, plt

    targets = sorted({m.rsplit("_", 1)[-1] for m in table.metric.unique() if m.startswith("ess_")})
    variants = [v for v in VARIANTS if v in set(table.variant)]
    colors = {"arbg": "tab:red", "flow": "tab:blue", "cnf": "tab:green"}
    pl = plt()
    for t in targets:
        # energy histograms: proposal and reweighted, against the reference
        fig, axes = pl.subplots(1, len(variants), figsize=(4.2 * len(variants), 3.6), squeeze=False, sharey=True)
        for ax, v in zip(axes[0], variants):
            for metric, style, label in ((f"ehist_ref_{t}", dict(color="k", lw=2), "reference (MALA)"),
                                         (f"ehist_model_{t}", dict(color=colors[v], ls="--"), f"{v} proposal"),
                                         (f"ehist_rw_{t}", dict(color=colors[v]), f"{v} reweighted")):
                sub = table[(table.metric == metric) & (table.variant == v)]
                if sub.empty:
                    continue
                g = sub.groupby("x").value
                mean, std = g.mean(), g.std().fillna(0.0)
                ax.plot(mean.index, mean.values, label=label, **style)
                ax.fill_between(mean.index, (mean - std).clip(lower=0), mean + std, alpha=0.12,
                                color=style["color"])
            ax.set_xlabel(f"energy E(x) ({t.upper()}, units of k_B T)")
            ax.set_title(v)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        axes[0, 0].set_ylabel("density (per energy unit)")
        fig.suptitle(f"{t.upper()}: do proposal and reweighted energies match the reference? (mean ± std over seeds)")
        save_figure(fig, plots_dir / f"energy_hist_{t}.png", dpi=110)

        # ESS / E-W2 (cropped, reweighted) / NLL per variant, one dot per seed
        fig, axes = pl.subplots(1, 5, figsize=(20, 3.8))
        panels = ((f"ess_{t}", "normalised Kish ESS (fraction of n)", "ESS (higher is better)"),
                  (f"ew2_crop_ref_{t}", "E-W2, energies cropped at max E_ref + margin (k_B T, log)",
                   "reference-cropped E-W2 (lower is better)"),
                  (f"ew2_bulk_{t}", "E-W2 of the samples below max E_ref (k_B T, log)", "bulk E-W2 (lower is better)"),
                  (f"ew2_rw_{t}", "E-W2 after reweighting (k_B T, log)", "reweighted E-W2 (lower is better)"),
                  (f"nll_{t}", "test NLL (nats, free coordinates)", "held-out NLL (lower is better)"))
        n_eval = params.get("eval", {}).get("n_samples")
        for ax, (metric, ylabel, title) in zip(axes, panels):
            allv = table[table.metric == metric].value.to_numpy()
            allv = allv[np.isfinite(allv) & (allv > 0)]
            for i, v in enumerate(variants):
                vals = table[(table.metric == metric) & (table.variant == v)].value.to_numpy()
                if len(vals) == 0:
                    continue
                ax.bar(i, vals.mean(), color=colors[v], alpha=0.6)
                ax.scatter(np.full(len(vals), i), vals, color="k", s=12, zorder=3)
            ax.set_xticks(range(len(variants)), variants)
            ax.set_ylabel(ylabel)
            ax.set_title(title, fontsize=10)
            if metric != f"nll_{t}" and len(allv):
                ax.set_yscale("log")
                lo = min(allv.min(), 1.0 / n_eval) if (n_eval and metric == f"ess_{t}") else allv.min()
                ax.set_ylim(lo / 2, allv.max() * 2)
            ax.grid(alpha=0.3, axis="y", which="both")
        if n_eval:
            axes[0].axhline(1.0 / n_eval, color="k", ls=":", lw=1)
            axes[0].annotate("1/n: one sample carries all weight", (0.02, 1.0 / n_eval), xycoords=("axes fraction", "data"),
                             fontsize=7, va="bottom")
        fig.suptitle(f"{t.upper()}: does the autoregressive BG beat the flows? (bars: mean, dots: seeds)")
        save_figure(fig, plots_dir / f"ess_{t}.png", dpi=110)

        curve_plot(table, f"val_loss_{t}", plots_dir / f"curve_val_loss_{t}.png", xlabel="training step",
                   ylabel="validation loss (NLL nats for arbg/flow; FM loss for cnf)",
                   title=f"{t.upper()}: has every model finished training? (validation split)", variants=variants)
        curve_plot(table, f"lr_{t}", plots_dir / f"curve_lr_{t}.png", xlabel="training step", logy=True,
                   ylabel="learning rate (peak chosen on validation)",
                   title=f"{t.upper()}: learning rate per variant (constant floor in the tail)", variants=variants)
