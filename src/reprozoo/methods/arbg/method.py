"""ArBG in miniature: an autoregressive Boltzmann generator against a spline flow and a CNF.

Variants (same data, same optimiser, learning-rate grid, schedule, steps and batch; comparable
parameter counts):
  arbg  - discretised coordinates, causal transformer, uniform dequantisation (the paper's method)
  flow  - neural spline flow over all coordinates (discrete-time BG baseline)
  cnf   - E(n)-equivariant flow-matching CNF (EGNN field, mean-free base), exact-divergence likelihood
          (continuous-time BG, the paper's equivariant baseline family)

Stages.
  train_shared (per seed): for every target in ``targets`` (dw4 at smoke; dw4 and lj13 at paper),
    MALA samples of the exact Boltzmann density (shared block) from three disjoint sets of chains
    (train / validation / test), training set augmented by symmetry images (data.py), saved as
    ``<target>.pt``.
  train (per variant x seed): maximum likelihood (flow matching for the CNF) with Adam under the
    platform's shared rule (:func:`fit_shared`, blocks/fitting.fit_to_plateau, config ``fit``): one
    learning-rate grid piloted on the validation split for every variant, the best rate continued
    at its constant rate until the plateau test (on the gate's ``value`` scale) holds, then one drop
    to a tenth and on to a second plateau after it, the best validation checkpoint kept; validation and learning-rate curves every ``eval_every`` steps (the
    convergence gate reads both). Then ``n_samples`` proposal samples with their exact log q, log
    importance weights log w = -E(x)/T - log q(y), and the metrics:
      ess_clip_<t> the authors' ESS: normalised Kish ESS of the weights left after AutoBG's
                   clip_reweighting_logits (top 0.2 % of log weights dropped; the claimed ESS)
      ess_clip_a_<t>, ess_clip_b_<t>  the same on two disjoint halves of the n samples (stability)
      ess_<t>      normalised Kish ESS of all n weights (1 = perfect proposal, 1/n = one sample counts);
                   n_eff_<t> = n x ESS
      ess_a_<t>, ess_b_<t>  the same ESS on two disjoint halves of the n samples (noise check)
      ew2_crop_<t> E-W2 (energy units of the target, k_B T = 1) between proposal and test reference
                   energies, both clipped to [-crop, crop] (AutoBG's cropped E-W2, crop 1000)
      ew2_crop_ref_<t>  the same with the upper clip at max(E_ref) + ref_crop_margin (our variant)
      ew2_bulk_<t> E-W2 of the proposal samples at or below max(E_ref) against the reference
      ew2_ref_floor_<t>  E-W2 between the two chain-disjoint halves of the reference (its noise)
      *_early_<t>  ESS and E-W2 of the ArBG after ``early_step`` updates (the flow claims' control)
      *_init_<t>   the same for the untrained ArBG, its initial weights (the CNF claims' control)
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


def clipped_ess(log_w, frac: float) -> float:
    """The authors' ESS: the normalised Kish ESS of the log weights that survive AutoBG's
    ``clip_reweighting_logits`` (the top ``frac`` of log weights dropped, :func:`trim_top_log_weights`),
    normalised by the number kept. The plain Kish ESS of all weights is set by the few largest
    weights of a heavy-tailed set and is then not reproducible between two halves of the same
    sample (measured in the README); the clipped one is the estimator the paper's tables report."""
    from ...blocks import gen_metrics as M

    lw = trim_top_log_weights(log_w, frac)
    return M.kish_ess(lw[np.isfinite(lw)]) if np.isfinite(lw).any() else 0.0


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


def nll_subset(y_test, n_nll: int | None):
    """The test samples the NLL reads: every k-th of the chain-major test set (k = len // n_nll), so
    that ``n_nll`` samples come from every test chain alike (a chain's states are strongly correlated:
    the number of chains, not of states, sets the standard error); all of them when ``n_nll`` is None
    or at least the set's size."""
    if not n_nll or int(n_nll) >= len(y_test):
        return y_test
    return y_test[:: len(y_test) // int(n_nll)][: int(n_nll)]


def evaluate(model, target, y_test, n_samples: int, generator, hist_range, crop: float = 1000.0,
             trim: float = 0.002, chunk: int = 5000, ref_half=None, ref_crop_margin: float = 10.0,
             with_nll: bool = True, n_nll: int | None = None):
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
        # the authors' ESS (top `trim` of log weights dropped first), on all n and on each half
        # (each half clipped on its own quantile: the estimator on n/2 samples, twice)
        "ess_clip": clipped_ess(log_w, trim),
        "ess_clip_a": clipped_ess(log_w[:half], trim),
        "ess_clip_b": clipped_ess(log_w[half:], trim),
        "ew2": M.energy_w2(e_model, e_ref),                   # proposal, no crop (tail-dominated)
        "ew2_crop": cropped_energy_w2(e_model, e_ref, crop),  # proposal, energies clipped (authors, +-1000)
        "ew2_crop_ref": cropped_energy_w2(e_model, e_ref, crop, cap=cap),  # clipped at max E_ref + margin
        # the same on each half of the n samples: how much of the seed-to-seed spread is sample noise
        "ew2_crop_ref_a": cropped_energy_w2(e_model[:half], e_ref, crop, cap=cap),
        "ew2_crop_ref_b": cropped_energy_w2(e_model[half:], e_ref, crop, cap=cap),
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
        # test NLL on every k-th held-out sample (``n_nll`` of them, spread over every test chain; all
        # when None): the CNF's likelihood is an ODE solve per sample
        y_nll = nll_subset(y_test, n_nll)
        with torch.no_grad():
            lq_test = torch.cat([model.log_prob(y_nll[i:i + chunk].float()).double().cpu()
                                 for i in range(0, len(y_nll), chunk)])
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


def fit_shared(variant: str, y_train, y_val, scale: float, p: dict, seed: int, early: int | None,
               progress=print):
    """Train ``variant`` with :func:`reprozoo.blocks.fitting.fit_to_plateau` (config ``fit``: the same
    learning-rate grid, pilot length, plateau scale and tolerance and step cap for every variant;
    minibatches of ``fit.batch`` drawn with replacement; validation = the model's own loss on the
    validation split, :func:`_val_loss`). ``early`` (a step): keep the chosen run's parameters after
    that many updates (``record["snapshot"]``, through the rule's ``after_step`` hook), the flow
    claims' control. ``record["init"]`` holds the initial parameters (the same for every rate): the
    untrained model, the CNF claims' control. Returns ``(model, record)`` with ``train`` / ``val`` /
    ``lr`` curves as (step, value) pairs."""
    import copy

    import torch

    from ...blocks.fitting import fit_to_plateau
    from .models import build

    fp = p["fit"]
    batch, n = int(fp["batch"]), len(y_train)
    snaps, init = {}, {}

    def make(gen):
        torch.manual_seed(seed)              # the same initial weights for every rate
        m = build(variant, y_train.shape[1], scale, p).to(y_train.device)
        init.setdefault("state", copy.deepcopy(m.state_dict()))
        return m

    def keep_early(model, step):             # called after update number step + 1
        if early is not None and step + 1 == early:
            snaps[id(model)] = copy.deepcopy(model.state_dict())

    def train_loss(model, gen):
        idx = torch.randint(0, n, (min(batch, n),), generator=gen).to(y_train.device)
        if _takes_generator(model):
            if y_train.device.type != "cpu":   # the CNF's noise is drawn on the data's device
                gen = torch.Generator(device=y_train.device).manual_seed(
                    int(torch.randint(0, 2**62, (1,), generator=gen)))
            return model.loss(y_train[idx], gen)
        return model.loss(y_train[idx])

    def val_loss(model):
        with torch.no_grad():
            return float(_val_loss(model, y_val))

    model, rec = fit_to_plateau(make, train_loss, val_loss, fp, seed, label=variant, progress=progress,
                                after_step=keep_early)
    model.eval()
    vals = list(zip(rec["steps"], rec["vals"]))
    every = int(fp["eval_every"])
    tr = [(s, float(np.mean(rec["losses"][max(0, s - every):s]))) for s in rec["steps"] if s > 0]
    i_best = int(np.argmin(rec["vals"]))
    return model, {"train": tr, "val": vals, "lr": list(zip(rec["steps"], rec["lrs"])), "lr_peak": rec["lr"],
                   "pilot_val": sorted(rec["pilot_best"].items()), "best_step": rec["steps"][i_best],
                   "val_rise": float(rec["vals"][-1] - rec["vals"][i_best]), "snapshot": snaps.get(id(model)),
                   "init": init.get("state"), "stop": rec["stop"], "plateau": rec["plateau"],
                   "drop_step": rec.get("drop_step"), "drop_gain": rec.get("drop_gain"), "lr_edge": rec.get("lr_edge")}


def train(ctx) -> None:
    import torch

    from .models import build, n_params

    p, v = ctx.params, ctx.variant
    if v not in VARIANTS:
        raise ValueError(f"unknown variant {v!r}; this method has {VARIANTS}")
    ep = p["eval"]
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
        t0 = time.process_time()
        # the platform's shared rule (blocks.fitting.fit_to_plateau): one grid piloted on validation,
        # the best rate continued until the plateau test holds, one drop to a tenth, a second plateau
        early = int(ep["early_step"]) if v == "arbg" else None
        model, rec = fit_shared(v, y_tr, y_va, float(data["scale"]), p, ctx.seed * 7919 + k, early,
                                progress=lambda m: ctx.progress(f"{name} {m}"))
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
        # the shared rule's drop (relative gain of the best validation value; step) and whether the chosen
        # rate sat at the grid's edge (1 = top or bottom: the grid would not bracket it)
        if rec.get("drop_gain") is not None:
            ctx.metrics.scalar(f"drop_gain_{name}", float(rec["drop_gain"]))
            ctx.metrics.scalar(f"drop_step_{name}", float(rec["drop_step"]))
        ctx.metrics.scalar(f"lr_edge_{name}", float(rec.get("lr_edge") is not None))
        eval_kw = dict(crop=float(ep.get("energy_crop", 1000.0)), trim=float(ep.get("trim_log_weights", 0.002)),
                       ref_crop_margin=float(ep.get("ref_crop_margin", 10.0)))
        out, hists = evaluate(model, tgt, y_te, ep["n_samples"],
                              torch.Generator(device=device).manual_seed(ctx.seed * 1_000_003 + 202 + k),
                              p["energy_hist"][name], ref_half=data["test_half"], n_nll=ep.get("n_nll"), **eval_kw)
        for key, val in out.items():
            ctx.metrics.scalar(f"{key}_{name}", val)
        for key, (xs, ys) in hists.items():
            ctx.metrics.curve(f"{key}_{name}", xs, ys)
        if v == "cnf":
            ctx.metrics.scalar(f"ode_logq_err_{name}", cnf_ode_error(
                model, 256, torch.Generator(device=device).manual_seed(ctx.seed * 1_000_003 + 404 + k)))
        if v == "arbg":
            # the controls: the same ArBG after `early_step` updates (flow claims) and untrained, at its
            # initial weights (CNF claims), evaluated exactly like the trained one (same n, same seed)
            for tag, state in (("early", rec["snapshot"]), ("init", rec["init"])):
                if state is None:
                    continue
                model_c = build(v, y_tr.shape[1], float(data["scale"]), p).to(device)
                model_c.load_state_dict(state)
                oc, _ = evaluate(model_c, tgt, y_te, ep["n_samples"],
                                 torch.Generator(device=device).manual_seed(ctx.seed * 1_000_003 + 202 + k),
                                 p["energy_hist"][name], with_nll=False, **eval_kw)
                for key in ("ess", "ess_clip", "ess_clip_a", "ess_clip_b", "ew2_crop", "ew2_crop_ref", "ew2_bulk",
                            "ew2_rw", "frac_above_ref_max", "frac_above_crop"):
                    ctx.metrics.scalar(f"{key}_{tag}_{name}", oc[key])
                ctx.progress(f"{name}: {tag} checkpoint ESS (clipped) {oc['ess_clip']:.4f}, E-W2 crop {oc['ew2_crop']:.3f}, crop_ref "
                             f"{oc['ew2_crop_ref']:.3f}, bulk {oc['ew2_bulk']:.3f}, reweighted {oc['ew2_rw']:.3f}")
            ctx.metrics.scalar(f"early_step_{name}", early)
        if v == "arbg":
            iv = p.get("intervention", {})
            iout = intervention(model, tgt, y_te, int(iv.get("n_prefixes", 4)), int(iv.get("n_per_prefix", 256)),
                                torch.Generator(device=device).manual_seed(ctx.seed * 1_000_003 + 303 + k))
            iout["intervention_energy_mean_uncond"] = out["mean_energy"]
            for key, val in iout.items():
                ctx.metrics.scalar(f"{key}_{name}", val)
            ctx.progress(f"{name}: intervention (first particle fixed) prefix err {iout['intervention_prefix_err']:.3g} "
                         f"<= {iout['intervention_half_bin']:.3g}, ESS {iout['intervention_ess']:.4f}")
        ctx.progress(f"{name}: ESS clipped {out['ess_clip']:.4f} (halves {out['ess_clip_a']:.4f} / "
                     f"{out['ess_clip_b']:.4f}); "
                     f"ESS {out['ess']:.4f} (halves {out['ess_a']:.4f} / {out['ess_b']:.4f}, n_eff "
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
