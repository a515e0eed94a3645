"""LDR in miniature: ESS-vs-N curves of a flow Boltzmann generator, with and without LDR.

Variants (one per training objective; same data, flow, initialisation, minibatches, optimiser,
stopping rule and step cap at every N, and the learning rate (and λ) from one grid by one rule):
* ``ml``      (baseline) maximum likelihood, -mean log q(x) over the MCMC training set;
* ``ldr_var`` (method)   ML + λ Var(log q(x) + E(x)/T) over each minibatch (off-policy log-variance);
* ``ldr_mad`` (method)   ML + λ mean |ℓ - median ℓ|, ℓ = log q(x) + E(x)/T (another dispersion).

Benchmarks (config ``benchmarks:``, each with its own target, chart, N grid, flow, training and
evaluation settings, and the variants that run on it): at smoke the 2-D Gaussian mixture
(``gmm``) and DW4 (``dw4``, 4 particles in 2-D, in COM- and rotation-free coordinates).

Stages:
* train_shared (per seed): the reference data of every benchmark (training pool, nested subsets
  of size N, an independent validation set and test set, all with energy labels).
* train (variant x seed): the variant swept over every benchmark's N grid.

Training (train_flow): the shared rule of ``reprozoo.blocks.fitting`` (``PlateauRun``): Adam at
a constant learning rate (per variant, from one grid chosen on validation by one rule:
calibrate.py), the variant's own objective on the validation set every ``val_every`` steps (the
NLL for ML; NLL + λ D for LDR), stop once the gate's plateau test (value scale, ``flat_tol`` = half
the gate's tolerance) passes, not before ``min_steps``, at most ``max_steps``; then lr/10 until the
whole curve passes the same test again. The parameters with the best validation objective over
both phases are kept. The whole validation curve and its lr curve at every N are the convergence
gate's inputs; what the lr/10 phase gained is recorded (``anneal_gain_nll_*``, and at the largest N
the ESS before it, ``ess_phase1_nmax_*``).

Per N, on the trained flow, from 10^4 flow samples: Kish ESS (normalised, in [1/n, 1]) against
the exact target energy; E-W2 between the energies of flow samples and of test samples (kT):
unclipped, clipped at the top of the energy window (claimed), and importance-reweighted; test NLL per test
point (nats, density on the COM-free subspace, per unit); Var(log q + E/T) on the test set. From
the ESS curve: N(ESS*) at the benchmark's fixed level ESS* (efficiency.py). Per benchmark: the
E-W2 of an independent reference sample (the training pool) against the test set, the metric's
floor.
"""
from __future__ import annotations

import math
import time
import zlib

import numpy as np
from reprozoo.figures import save_figure

VARIANT_MEASURE = {"ml": None, "ldr_var": "variance", "ldr_mad": "mad"}
ORDER = ["ml", "ldr_var", "ldr_mad"]
# plot() draws the main figures; of the other curves only these get a generic figure
GENERIC_CURVES = {f"{k}_{b}": ("training samples N (MCMC)", label) for b in ("gmm", "dw4")
                  for k, label in (("test_logvar", "Var(log q + E/T) on the test set"),
                                   ("stop_step", "optimiser steps until the plateau stop"),
                                   ("anneal_gain_nll", "validation NLL gained by the lr/10 phase (nats)"))}


def _setup(b: dict):
    from ...blocks.boltzmann import make_target
    from .coords import make_chart

    target = make_target(b["target"], **b.get("target_kwargs", {}))
    return target, make_chart(b.get("chart", "comfree"), target)


def _stream(name: str) -> int:
    return zlib.crc32(name.encode()) % 997


def _seed(seed: int, n: int, stream: int, bench: str = "") -> int:
    """One integer per (seed, benchmark, N, stream): the same for every variant, so variants differ
    only in their objective (same initial flow, same minibatch sequence, same evaluation noise)."""
    return (seed * 1_000_003 + _stream(bench) * 7_919 + n * 101 + stream) % (2**31)


def benchmarks_for(p: dict, variant: str | None = None) -> dict[str, dict]:
    """The config's benchmarks (name -> settings), those that run ``variant`` if given."""
    out = {}
    for name, b in p["benchmarks"].items():
        if variant is None or variant in b.get("variants", ORDER):
            out[name] = b
    return out


# --- training ------------------------------------------------------------------------------------

def tail_improvement(steps, values, tail: float = 0.3, scale: str = "value") -> float:
    """How much a validation curve still improves over its last ``tail`` of training, relative to
    its level there: -(Theil-Sen slope) x (tail length) / |median of the tail| (``scale: value``;
    ``range`` divides by the whole improvement instead). The platform's convergence gate uses this
    measure with a 2 % tolerance: this is :func:`reprozoo.claims.tail_fit` itself. (The range scale
    let runs stop at min_steps: the first evaluation's loss, far above the rest, made any later
    slope look small.)"""
    from ...claims import tail_fit

    return tail_fit(steps, values, scale=scale, tail=tail)["improvement"]


def variant_setting(value, variant: str, what: str):
    """A per-variant constant of the config (``{ml: .., ldr_var: ..}``) or one value for all."""
    if isinstance(value, dict):
        if variant not in value:
            raise ValueError(f"{what}: no value for variant {variant!r} (have {sorted(value)})")
        return value[variant]
    return value


def train_flow(measure: str | None, weight: float, u, c, u_val, c_val, dim: int, b: dict, seed: int, n: int,
               bench: str = "", lr: float | None = None, keep_phase1: bool = False):
    """Fit one flow on u (flow coordinates; ``c`` = E/T + log_det, per point) by ML (+ λ D(ℓ)).

    The shared training rule (``reprozoo.blocks.fitting.PlateauRun``, the gate's own plateau test on
    the ``value`` scale, ``train.scale``): Adam at the constant ``lr`` until the variant's own validation objective
    (NLL for ML, NLL + λ D for LDR) is flat over the last 30 % of the curve (``flat_tol``, not before
    ``min_steps``, at most ``max_steps``); then the rate drops to ``final_lr_factor`` x lr (1/10, the
    gate's floor) and training goes on until the WHOLE curve, lr/10 phase included, passes the same
    plateau test again (at least 5 evaluations after the drop, at most ``max_steps`` more). Each
    stop also needs ``patience`` evaluations without a new best by ``min_delta`` (our condition on
    top of the gate's test: a slow steady descent passed the 1 % slope test at min_steps). With
    ``extend`` > 1 (``reprozoo converge --factor``), each phase runs on to ``extend`` x its length at
    the plateau. The parameters with the best validation objective over both phases are returned,
    with a record (the whole curve and its lr curve are the convergence gate's input)."""
    import torch

    from ...blocks.fitting import PlateauRun
    from ...blocks.flows import make_flow
    from .dispersion import objective

    fc, tc = b["flow"], b["train"]
    torch.manual_seed(_seed(seed, n, 0, bench))
    flow = make_flow(fc["kind"], dim, hidden=tuple(fc["hidden"]), transforms=int(fc["transforms"]),
                     **fc.get("kwargs", {})).to(u.device)
    flow.set_standardization(u)
    lr = float(tc["lr"] if lr is None else lr)
    gen = torch.Generator().manual_seed(_seed(seed, n, 1, bench))
    bs = min(int(tc["batch_size"]), n)
    every = int(tc["val_every"])
    min_steps, max_steps = int(tc["min_steps"]), int(tc["max_steps"])
    flat_tol = float(tc.get("flat_tol", 0.01))
    factor = float(tc.get("final_lr_factor", 0.1))
    extend = max(1, int(tc.get("extend", 1)))

    def train_loss(model, g):
        idx = torch.randint(0, n, (bs,), generator=g)
        return objective(model.log_prob(u[idx]), c[idx], measure, weight)[0]

    def val_loss(model):
        with torch.no_grad():
            v_loss, v_nll = objective(model.log_prob(u_val), c_val, measure, weight)
        return {"loss": float(v_loss), "nll": float(v_nll)}

    run = PlateauRun(flow, lr, train_loss, val_loss, every, gen, weight_decay=float(tc.get("weight_decay", 0.0)),
                     scale=str(tc.get("scale", "value")), select="loss", stop_on=["loss"])
    patience, min_delta = int(tc.get("patience", 0)), float(tc.get("min_delta", 0.0))

    def stalled() -> bool:
        """Our extra condition (on top of the gate's plateau test): no new best by min_delta in the
        last ``patience`` evaluations (a slow, steady descent can pass a 1 % slope test)."""
        if patience <= 0:
            return True
        if len(run.vals) <= patience:
            return False
        return min(run.vals[-patience:]) > min(run.vals[:-patience]) - min_delta

    def to_plateau(first: int, until: int) -> bool:
        while run.step < until:
            if run.advance(min(until, run.step + every), min_steps=first, tol=flat_tol) and stalled():
                return True
        return False

    stopped1 = to_plateau(min_steps, max_steps)
    stop1 = run.step
    if extend > 1:
        run.advance(min(max_steps, extend * stop1))
    # phase 1's best (the audit of the lr/10 phase compares against it)
    i1 = int(np.argmin(run.vals))
    best1, nll1, best_step1 = run.vals[i1], run.curves["nll"][i1], run.steps[i1]
    phase1 = {k: t.detach().clone() for k, t in run.best_state.items()} if keep_phase1 else None
    drop = run.step
    run.set_lr(lr * factor)
    stopped2 = to_plateau(drop + 5 * every, drop + max_steps)
    if extend > 1:
        run.advance(drop + extend * (run.step - drop))
    flow.load_state_dict(run.best_state)
    i = int(np.argmin(run.vals))
    rec = {"val_steps": run.steps, "val_loss": run.vals, "val_nll": run.curves["nll"], "lr": run.lrs,
           "stop_step": stop1, "best_step": best_step1, "capped": int(not (stopped1 and stopped2)),
           "final_step": run.step, "final_best_step": run.steps[i], "anneal_gain": best1 - run.vals[i],
           "anneal_gain_nll": nll1 - run.curves["nll"][i], "val_nll_final": run.curves["nll"][i],
           "lr_used": lr, "phase1_params": phase1,
           # the lr/10 phase's own flatness (the gate's measure over its points only)
           "tail_phase2": tail_improvement(run.steps[len(run.steps) - (run.step - drop) // every - 1:],
                                           run.vals[len(run.vals) - (run.step - drop) // every - 1:])}
    return flow, rec


def flow_coords(chart, x, e, temperature: float, device: str = "cpu"):
    """Cartesian configurations and their energies -> (u, c): flow coordinates and the part of
    ℓ = log q(x) + E(x)/T that does not depend on the flow, c = E/T + log_det(u), so that
    ℓ = log q_u(u) + c with log q(x) = log q_u(u) + log_det(u) on the COM-free subspace."""
    u = chart.to_internal(x.double())
    return u.float().to(device), (e.double() / temperature + chart.log_det(u)).float().to(device)


def evaluate(flow, target, chart, u_test, e_test, ev: dict, seed: int) -> dict:
    """ESS, per-point test NLL, the three E-W2, Var(ℓ) on the test set; the flow samples' energies.

    E-W2 (kT) between the energies of ``ev["n_samples"]`` flow samples and of the test set:
    ``ew2`` unclipped (recorded, not claimed: a few samples in the proposal's tail decide it),
    ``ew2c`` with both sides clipped at ``ev["energy_hi"]`` (the top of the energy window;
    ``crop_frac`` = the fraction of flow samples above it), ``ew2rw`` importance-reweighted
    (self-normalised weights p/q, unclipped; a diagnostic, not claimed)."""
    import torch

    from ...blocks.gen_metrics import energy_w2, kish_ess, log_importance_weights

    n_samples, crop = int(ev["n_samples"]), float(ev["energy_hi"])
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        u, log_qu = flow.rsample_and_log_prob(n_samples)
        u = u.double()
        log_q = log_qu.double() + chart.log_det(u)
        energy = target.energy(chart.from_flow(u, gen))
        test_lq = flow.log_prob(u_test).double() + chart.log_det(u_test.double())
    log_w = log_importance_weights(-energy / target.temperature, log_q)
    lw = np.where(np.isfinite(log_w), log_w, -np.inf)
    w = np.exp(lw - lw.max())
    e_np = energy.cpu().numpy()
    ell = (test_lq + e_test.double() / target.temperature).cpu().numpy()
    return {"ess": kish_ess(log_w), "nll_units": (-test_lq).cpu().numpy(), "ew2": energy_w2(energy, e_test),
            "ew2c": clipped_ew2(energy, e_test, crop), "ew2rw": energy_w2(energy, e_test, weights=w),
            "crop_frac": float(np.mean(~(e_np <= crop))),
            "test_logvar": float(np.var(ell)), "energies": e_np}


def clipped_ew2(e_model, e_ref, top: float) -> float:
    """E-W2 with both sides' energies clipped at ``top`` (the top of the energy window): a sample
    above it counts as a sample AT the top, so mass the flow puts up there is still a harm the
    metric sees (dropping it, the previous crop, hid it), while how far up it lies (10-300 kT for a
    handful of tail samples) no longer decides the number."""
    from ...blocks.gen_metrics import energy_w2

    em = np.asarray(e_model.cpu().numpy() if hasattr(e_model, "cpu") else e_model, float).ravel()
    er = np.asarray(e_ref.cpu().numpy() if hasattr(e_ref, "cpu") else e_ref, float).ravel()
    em = np.where(np.isnan(em), np.inf, em)  # a non-finite energy is off the top too
    return energy_w2(np.minimum(em, top), np.minimum(er, top))


def _histogram(energies, ev: dict) -> list[float]:
    edges = np.linspace(ev["energy_lo"], ev["energy_hi"], int(ev["energy_bins"]) + 1)
    e = np.asarray(energies, float)
    e = e[np.isfinite(e)]
    counts, _ = np.histogram(e, bins=edges)
    # density over the whole sample (mass outside the window is missing, not renormalised away)
    return (counts / max(len(e), 1) / np.diff(edges)).tolist()


def settings(b: dict, p: dict, variant: str) -> tuple[str | None, float, float]:
    """(dispersion measure, λ, lr) of a variant on a benchmark, from the config."""
    measure = VARIANT_MEASURE[variant]
    weight = 0.0
    if measure:
        weight = float(variant_setting(b.get("weight", p.get("ldr", {}).get("weight", {}).get(measure)),
                                       variant, "weight"))
    return measure, weight, float(variant_setting(b["train"]["lr"], variant, "train.lr"))


def sweep(variant: str, data: dict, b: dict, p: dict, seed: int, bench: str = "", progress=print) -> dict:
    """Train and evaluate one variant at every N of a benchmark's grid; a JSON-able dict of curves."""
    import torch

    target, chart = _setup(b)
    device = p.get("device", "cpu")
    temp = target.temperature
    measure, weight, lr = settings(b, p, variant)
    u_pool, c_pool = flow_coords(chart, data["pool"], data["e_pool"], temp, device)
    u_val, c_val = flow_coords(chart, data["val"], data["e_val"], temp, device)
    u_test, _ = flow_coords(chart, data["test"], data["e_test"], temp, device)
    ns, ev = [int(n) for n in b["n_grid"]], b["eval"]
    keys = ("ess", "nll", "ew2", "ew2c", "ew2rw", "crop_frac", "test_logvar", "train_logvar", "stop_step",
            "best_step", "final_step", "capped", "anneal_gain", "anneal_gain_nll", "tail_phase2", "seconds")
    out = {"n": ns, **{k: [] for k in keys}, "nll_units": {}, "val": {}, "weight": weight, "lr_used": lr}
    # the metric's floor: an independent reference sample (the training pool at the largest N, from
    # chains independent of the test set's) scored against the test set with the same crop
    out["ew2_ref"] = clipped_ew2(data["e_pool"], data["e_test"], float(ev["energy_hi"]))
    for n in ns:
        t0 = time.perf_counter()
        flow, rec = train_flow(measure, weight, u_pool[:n], c_pool[:n], u_val, c_val, chart.dim, b, seed, n, bench,
                               lr=lr, keep_phase1=n == ns[-1])
        flow.eval()
        eval_seed = _seed(seed, n, 2, bench)
        res = evaluate(flow, target, chart, u_test, data["e_test"], ev, eval_seed)
        with torch.no_grad():
            ell = flow.log_prob(u_pool[:n]).double() + c_pool[:n].double()
        if n == ns[-1]:  # the audit of phase 2: ESS of phase 1's flow, same evaluation noise
            final = {k: t.clone() for k, t in flow.state_dict().items()}
            flow.load_state_dict(rec["phase1_params"])
            out["ess_phase1_nmax"] = evaluate(flow, target, chart, u_test, data["e_test"], ev, eval_seed)["ess"]
            flow.load_state_dict(final)
        out["seconds"].append(time.perf_counter() - t0)
        for k in ("ess", "ew2", "ew2c", "ew2rw", "crop_frac", "test_logvar"):
            out[k].append(res[k])
        out["nll"].append(float(np.mean(res["nll_units"])))
        out["train_logvar"].append(float(ell.var(unbiased=False)))
        for k in ("stop_step", "best_step", "final_step", "capped", "anneal_gain", "anneal_gain_nll", "tail_phase2"):
            out[k].append(rec[k])
        out["nll_units"][str(n)] = res["nll_units"].tolist()
        out["val"][str(n)] = {k: rec[k] for k in ("val_steps", "val_loss", "val_nll", "lr")}
        for tag, n_tag in (("nmin", ns[0]), ("nmax", ns[-1])):
            if n == n_tag:
                out[f"energy_hist_{tag}"] = _histogram(res["energies"], ev)
        progress(f"{bench} {variant} N={n}: ESS {res['ess']:.3f} NLL {out['nll'][-1]:.3f} "
                 f"E-W2 {res['ew2']:.3f} / clipped {res['ew2c']:.3f} / reweighted {res['ew2rw']:.3f} "
                 f"(stop {rec['stop_step']}, best {rec['best_step']}, lr/10 to {rec['final_step']}, "
                 f"gain {rec['anneal_gain_nll']:.4f} nats, {out['seconds'][-1]:.1f}s)")
    out["energy_hist_ref"] = _histogram(data["e_test"].cpu().numpy(), ev)
    return out


# --- stages --------------------------------------------------------------------------------------

def datasets(name: str, b: dict, seed: int) -> dict:
    """The reference data of one benchmark for one seed (data.py)."""
    from .data import make_datasets

    target, _ = _setup(b)
    return make_datasets(target, max(int(n) for n in b["n_grid"]), int(b["n_val"]), int(b["n_test"]), seed,
                         b.get("mcmc", {}), stream=_stream(name))


def train_shared(ctx) -> None:
    import torch

    for name, b in benchmarks_for(ctx.params).items():
        t0 = time.perf_counter()
        data = datasets(name, b, ctx.seed)
        torch.save(data, ctx.outdir / f"data_{name}.pt")
        ctx.progress(f"{name}: pool {tuple(data['pool'].shape)}, val {tuple(data['val'].shape)}, "
                     f"test {tuple(data['test'].shape)}, mean test energy {float(data['e_test'].mean()):.3f} "
                     f"({time.perf_counter() - t0:.1f}s)")


def record(ctx, name: str, res: dict, b: dict) -> None:
    """Curves over N, scalars at the largest N and at the control N, N(ESS*), convergence curves."""
    from .efficiency import n_to_reach, reach_ok

    m, ns = ctx.metrics, res["n"]
    for k in ("ess", "nll", "ew2", "ew2c", "ew2rw", "crop_frac", "test_logvar", "train_logvar", "stop_step",
              "best_step", "final_step", "capped", "anneal_gain", "anneal_gain_nll", "tail_phase2"):
        m.curve(f"{k}_{name}", ns, res[k])
    for k in ("ess", "ew2", "ew2c", "ew2rw", "crop_frac"):
        m.scalar(f"{k}_nmax_{name}", res[k][-1])
    for k in ("ess", "ew2", "ew2c"):  # the claimed metrics' controls (ew2: the clipped one's N)
        m.scalar(f"{k}_nctl_{name}", res[k][ns.index(control_n(b, k, ns))])
    m.scalar(f"ew2_ref_{name}", res["ew2_ref"])
    m.scalar(f"ess_phase1_nmax_{name}", res["ess_phase1_nmax"])
    m.scalar(f"anneal_gain_nll_nmax_{name}", res["anneal_gain_nll"][-1])
    m.units(f"nll_nmax_{name}", res["nll_units"][str(ns[-1])])
    m.units(f"nll_nctl_{name}", res["nll_units"][str(control_n(b, "nll", ns))])
    m.scalar(f"ess_best_{name}", max(res["ess"]))
    star = float(b["ess_star"])
    n_star, censored = n_to_reach(ns, res["ess"], star)
    m.scalar(f"n_reach_{name}", n_star)
    m.scalar(f"n_reach_censored_{name}", censored)
    m.scalar(f"ess_reach_margin_{name}", max(res["ess"]) - star)  # > 0: the curve reaches ESS*
    m.scalar(f"reach_ok_{name}", reach_ok(res["ess"], star))  # per seed: > 0.5 iff ESS* is reached
    # > log10 2: N(ESS*) at least twice the smallest N, so a 2x saving is visible on the grid
    m.scalar(f"n_reach_room_{name}", math.log10(n_star) - math.log10(ns[0]))
    m.scalar(f"capped_runs_{name}", float(sum(res["capped"])))
    m.scalar(f"train_seconds_{name}", sum(res["seconds"]))
    m.scalar(f"lambda_{name}", res["weight"])
    m.scalar(f"lr_used_{name}", res["lr_used"])
    ev = b["eval"]
    edges = np.linspace(ev["energy_lo"], ev["energy_hi"], int(ev["energy_bins"]) + 1)
    centres = 0.5 * (edges[1:] + edges[:-1])
    m.curve(f"energy_hist_ref_{name}", centres, res["energy_hist_ref"])
    for n in ns:  # every run's validation curve and lr (the convergence gate reads each N)
        v = res["val"][str(n)]
        tags = [f"n{n}"] + (["nmin"] if n == ns[0] else []) + (["nmax"] if n == ns[-1] else [])
        for tag in tags:
            m.curve(f"val_loss_{name}_{tag}", v["val_steps"], v["val_loss"])
            m.curve(f"val_nll_{name}_{tag}", v["val_steps"], v["val_nll"])
            m.curve(f"lr_{name}_{tag}", v["val_steps"], v["lr"])
    for tag in ("nmin", "nmax"):
        m.curve(f"energy_hist_{name}_{tag}", centres, res[f"energy_hist_{tag}"])
    ctx.progress(f"{name}: N(ESS*={star:g}) = {n_star:.0f}" + {0: "", -1: " (reached at the smallest N)",
                                                               1: " (never reached)"}[censored])


def control_n(b: dict, metric: str, ns) -> int:
    """The N of the no-harm control on ``metric`` (ML on N samples against ML on the largest N):
    ``n_control`` is one N for every metric, or one per metric (calibrate.py ``sweeps``; the
    unclipped E-W2, not claimed, uses the clipped one's)."""
    ctl = b["n_control"]
    if isinstance(ctl, dict):
        key = "ew2c" if metric == "ew2" else metric
        if key not in ctl:
            raise ValueError(f"n_control: no value for {key!r} (have {sorted(ctl)})")
        ctl = ctl[key]
    n = int(ctl)
    if n not in ns:
        raise ValueError(f"n_control {n} ({metric}) is not on the N grid {list(ns)}")
    return n


def _load_data(shared_dir, name: str):
    import torch

    return torch.load(shared_dir / f"data_{name}.pt", weights_only=True)


def train(ctx) -> None:
    p = ctx.params
    if ctx.variant not in VARIANT_MEASURE:
        raise ValueError(f"unknown variant {ctx.variant!r}; one of {sorted(VARIANT_MEASURE)}")
    for name, b in benchmarks_for(p, ctx.variant).items():
        res = sweep(ctx.variant, _load_data(ctx.shared_dir, name), b, p, ctx.seed, name, ctx.progress)
        record(ctx, name, res, b)


# --- plots ---------------------------------------------------------------------------------------

def plot(table, plots_dir, params: dict) -> None:
    """Per benchmark: ESS vs N with ESS*, NLL and E-W2 vs N, validation curves, energy histograms."""
    from ...plotting import plt

    for name, b in params["benchmarks"].items():
        variants = [v for v in ORDER if v in set(table[table.metric == f"ess_{name}"].variant)]
        if not variants:
            continue
        p = plt()
        _ess_plot(plots_dir / f"curve_ess_{name}.png", table, name, variants, float(b["ess_star"]), p)
        _panels(plots_dir / f"curve_nll_ew2_{name}.png", table, variants, p, logx=True,
                panels=[(f"nll_{name}", "test NLL (nats)", False), (f"ew2c_{name}", "E-W2, clipped at the window top (kT)", True),
                        (f"ew2rw_{name}", "E-W2, reweighted (kT)", True), (f"ew2_{name}", "E-W2, unclipped (kT)", True)],
                xlabel="training samples N (MCMC)", title=f"{name.upper()}: held-out NLL and energy W2 vs N")
        _panels(plots_dir / f"curve_val_loss_{name}.png", table, variants, p, logx=False,
                panels=[(f"val_loss_{name}_nmin", "validation objective, smallest N", False),
                        (f"val_loss_{name}_nmax", "validation objective, largest N", False)],
                xlabel="optimiser step (constant lr, then lr/10 after the plateau)",
                title=f"{name.upper()}: has training flattened (and where did it stop)?")
        _energy_histograms(table, plots_dir, name, variants, name.upper(), p)


def _panels(path, table, variants, p, panels, xlabel, title, logx) -> None:
    fig, axes = p.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, (metric, ylabel, logy) in zip(axes[0], panels):
        sub = table[table.metric == metric]
        for v in variants:
            g = sub[sub.variant == v].groupby("x").value
            mean, std = g.mean(), g.std().fillna(0.0)
            if mean.empty:
                continue
            ax.plot(mean.index, mean.values, marker="o" if logx else None, ms=3, label=v)
            ax.fill_between(mean.index, np.maximum(mean - std, mean * 1e-3) if logy else mean - std, mean + std,
                            alpha=0.2)
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title + " (mean ± std over seeds)")
    save_figure(fig, path, dpi=100)


def _ess_plot(path, table, name, variants, level, p) -> None:
    """ESS vs N, mean ± std over seeds, with the fixed level ESS* that N(ESS*) is read at."""
    fig, ax = p.subplots(figsize=(5.5, 4))
    sub = table[table.metric == f"ess_{name}"]
    for v in variants:
        g = sub[sub.variant == v].groupby("x").value
        mean, std = g.mean(), g.std().fillna(0.0)
        ax.plot(mean.index, mean.values, marker="o", ms=3, label=v)
        ax.fill_between(mean.index, mean - std, mean + std, alpha=0.2)
    ax.axhline(level, color="k", ls=":", lw=1, label=f"ESS* = {level:g}")
    ax.set_xscale("log")
    ax.set_xlabel("training samples N (MCMC)")
    ax.set_ylabel("Kish ESS / n (normalised; mean ± std over seeds)")
    ax.set_title(f"{name.upper()}: ESS vs N at the fixed level ESS*")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=110)


def _energy_histograms(table, plots_dir, name, variants, label, p) -> None:
    ref = table[table.metric == f"energy_hist_ref_{name}"].groupby("x").value.mean()
    if ref.empty:
        return
    fig, axes = p.subplots(1, len(variants), figsize=(4.2 * len(variants), 3.6), squeeze=False, sharey=True)
    ns = table[(table.metric == f"ess_{name}")].x
    for ax, v in zip(axes[0], variants):
        ax.plot(ref.index, ref.values, "k-", lw=2, label="MCMC test set")
        for tag, style, n in (("nmin", "--", ns.min()), ("nmax", "-", ns.max())):
            sub = table[(table.metric == f"energy_hist_{name}_{tag}") & (table.variant == v)]
            g = sub.groupby("x").value
            mean, std = g.mean(), g.std().fillna(0.0)
            if mean.empty:
                continue
            ax.plot(mean.index, mean.values, style, label=f"flow, N={int(n)}")
            ax.fill_between(mean.index, np.maximum(mean - std, 0), mean + std, alpha=0.2)
        ax.set_title(v)
        ax.set_xlabel("energy E (kT)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0, 0].set_ylabel("density (1/kT)")
    fig.suptitle(f"{label}: do flow samples have the target's energies? (mean ± std over seeds)")
    save_figure(fig, plots_dir / f"energy_hist_{name}.png", dpi=110)

