"""LDR in miniature: ESS-vs-N curves of a flow Boltzmann generator, with and without LDR.

Variants (one per training objective; same data, flow, initialisation, minibatches, steps, lr):
* ``ml``      (baseline) maximum likelihood, -mean log q(x) over the MCMC training set;
* ``ldr_var`` (method)   ML + λ Var(log q(x) + E(x)/T) over each minibatch (off-policy log-variance);
* ``ldr_mad`` (method)   ML + λ mean |ℓ - median ℓ|, ℓ = log q(x) + E(x)/T (another dispersion).

Stages:
* train_shared (per seed): MCMC reference data (training pool, nested subsets of size N, and an
  independent test set, with energy labels), then the ML baseline swept over N: its ESS-vs-N curve
  is what every LDR cell reads its sample-efficiency ratio against (blocks/flows.fit_ml).
* train (variant x seed): the variant swept over the same N grid; ``ml`` reports the shared sweep.

Per N, measured on the trained flow: Kish ESS (normalised, in [1/n, 1]) of n_eval flow samples
against the exact target energy; NLL of the held-out test set (nats, in the internal coordinates);
E-W2 between energies of flow samples and of test samples (units of kT). Curves over N are the
claims' inputs; ``sample_efficiency`` = N_ml(ESS*) / N_variant(ESS*) at the baseline's best ESS
(efficiency.py). Convergence: validation NLL every ``val_every`` steps at the smallest and
largest N, and its final slope.
"""
from __future__ import annotations

import json
import time

import numpy as np
from reprozoo.figures import save_figure

VARIANT_MEASURE = {"ml": None, "ldr_var": "variance", "ldr_mad": "mad"}


def _setup(p: dict):
    from ...blocks.boltzmann import make_target
    from .coords import ComFreeChart

    target = make_target(p["target"], **p.get("target_kwargs", {}))
    return target, ComFreeChart.for_target(target)


def _seed(seed: int, n: int, stream: int) -> int:
    """One integer per (seed, N, stream): the same for every variant, so variants differ only in
    their objective (same initial flow, same minibatch sequence, same evaluation noise)."""
    return (seed * 1_000_003 + n * 101 + stream) % (2**31)


def train_flow(measure: str | None, x_train, x_val, target, chart, p: dict, seed: int, n: int):
    """Fit one flow on x_train (internal coordinates) by ML (+ λ D(ℓ) if ``measure``)."""
    import torch

    from ...blocks.flows import fit_ml, make_flow
    from .dispersion import CachedLogProb, Objective

    fc, tc = p["flow"], p["train"]
    torch.manual_seed(_seed(seed, n, 0))
    flow = make_flow(fc["kind"], chart.dim, hidden=tuple(fc["hidden"]), transforms=int(fc["transforms"]),
                     **fc.get("kwargs", {})).to(x_train.device)
    flow.set_standardization(x_train)

    def energy_fn(y):
        return target.energy(chart.to_cartesian(y))

    weight = float(p["ldr"]["weight"][measure]) if measure else 0.0
    objective = Objective(energy_fn, measure, weight, target.temperature, x_val, int(tc["val_every"]))
    gen = torch.Generator().manual_seed(_seed(seed, n, 1))
    losses = fit_ml(CachedLogProb(flow), x_train, steps=int(tc["steps"]), batch_size=int(tc["batch_size"]),
                    lr=float(tc["lr"]), weight_decay=float(tc.get("weight_decay", 0.0)), generator=gen,
                    extra_loss=objective)
    return flow, objective, losses


def evaluate(flow, target, chart, x_test, e_test, n_samples: int, seed: int) -> dict:
    """ESS, test NLL, E-W2 of a trained flow; also the energies of its samples (for histograms)."""
    import torch

    from ...blocks.gen_metrics import energy_w2, kish_ess, log_importance_weights, nll

    torch.manual_seed(seed)
    with torch.no_grad():
        y, log_q = flow.rsample_and_log_prob(n_samples)
        energy = target.energy(chart.to_cartesian(y.double()))
    log_w = log_importance_weights(-energy / target.temperature, log_q.double())
    return {"ess": kish_ess(log_w), "nll": nll(flow.log_prob, x_test), "ew2": energy_w2(energy, e_test),
            "energies": energy.cpu().numpy()}


def _slope_per_100(steps, values, tail: float = 0.3) -> float:
    """Least-squares slope of the last ``tail`` fraction of a curve, per 100 steps."""
    steps, values = np.asarray(steps, float), np.asarray(values, float)
    keep = steps >= steps[-1] * (1 - tail)
    if keep.sum() < 2:
        return float("nan")
    return float(100 * np.polyfit(steps[keep], values[keep], 1)[0])


def _histogram(energies, ev: dict) -> list[float]:
    edges = np.linspace(ev["energy_lo"], ev["energy_hi"], int(ev["energy_bins"]) + 1)
    e = np.asarray(energies, float)
    e = e[np.isfinite(e)]
    counts, _ = np.histogram(e, bins=edges)
    # density over the whole sample (mass outside the window is missing, not renormalised away)
    return (counts / max(len(e), 1) / np.diff(edges)).tolist()


def sweep(measure: str | None, data: dict, p: dict, seed: int, progress=print) -> dict:
    """Train and evaluate the variant at every N of the grid; a JSON-able dict of curves."""
    import torch

    target, chart = _setup(p)
    device = p.get("device", "cpu")
    pool = chart.to_internal(data["pool"]).float().to(device)
    test = chart.to_internal(data["test"]).float().to(device)
    ns = [int(n) for n in p["n_grid"]]
    ev = p["eval"]
    out = {"n": ns, "ess": [], "nll": [], "ew2": [], "seconds": [], "final_dispersion": []}
    for n in ns:
        t0 = time.perf_counter()
        flow, obj, losses = train_flow(measure, pool[:n], test, target, chart, p, seed, n)
        flow.eval()
        res = evaluate(flow, target, chart, test, data["e_test"], int(ev["n_samples"]), _seed(seed, n, 2))
        out["seconds"].append(time.perf_counter() - t0)
        for k in ("ess", "nll", "ew2"):
            out[k].append(res[k])
        tail = max(1, len(obj.train_dispersion) // 10)
        out["final_dispersion"].append(float(np.mean(obj.train_dispersion[-tail:])))
        for tag, n_tag in (("nmin", ns[0]), ("nmax", ns[-1])):
            if n == n_tag:
                out[f"val_steps_{tag}"], out[f"val_nll_{tag}"] = obj.val_steps, obj.val_nll
                out[f"train_nll_{tag}"] = obj.train_nll
                out[f"energy_hist_{tag}"] = _histogram(res["energies"], ev)
        progress(f"{measure or 'ml'} N={n}: ESS {res['ess']:.3f} NLL {res['nll']:.3f} E-W2 {res['ew2']:.3f} "
                 f"({out['seconds'][-1]:.1f}s)")
    with torch.no_grad():
        out["energy_hist_ref"] = _histogram(data["e_test"].cpu().numpy(), ev)
    return out


def _load_data(shared_dir):
    import torch

    return torch.load(shared_dir / "data.pt", weights_only=True)


def train_shared(ctx) -> None:
    import torch

    from .data import make_datasets

    p = ctx.params
    target, _ = _setup(p)
    t0 = time.perf_counter()
    data = make_datasets(target, max(p["n_grid"]), int(p["n_test"]), ctx.seed, p["mcmc"])
    ctx.metrics.scalar("data_seconds", time.perf_counter() - t0)
    torch.save(data, ctx.outdir / "data.pt")
    ctx.progress(f"data: pool {tuple(data['pool'].shape)}, test {tuple(data['test'].shape)} "
                 f"({time.perf_counter() - t0:.1f}s)")
    res = sweep(None, data, p, ctx.seed, ctx.progress)
    (ctx.outdir / "ml_sweep.json").write_text(json.dumps(res))


def record(ctx, res: dict, p: dict) -> None:
    """Curves over N, scalars at the largest N, convergence curves and energy histograms."""
    m, ns = ctx.metrics, res["n"]
    for k in ("ess", "nll", "ew2", "final_dispersion"):
        m.curve(k, ns, res[k])
    m.scalar("ess_nmax", res["ess"][-1])
    m.scalar("nll_nmax", res["nll"][-1])
    m.scalar("ew2_nmax", res["ew2"][-1])
    m.scalar("ess_best", max(res["ess"]))
    m.scalar("train_seconds", sum(res["seconds"]))
    ev = p["eval"]
    edges = np.linspace(ev["energy_lo"], ev["energy_hi"], int(ev["energy_bins"]) + 1)
    centres = 0.5 * (edges[1:] + edges[:-1])
    m.curve("energy_hist_ref", centres, res["energy_hist_ref"])
    for tag in ("nmin", "nmax"):
        m.curve(f"val_nll_{tag}", res[f"val_steps_{tag}"], res[f"val_nll_{tag}"])
        m.scalar(f"val_nll_slope_{tag}", _slope_per_100(res[f"val_steps_{tag}"], res[f"val_nll_{tag}"]))
        tr = res[f"train_nll_{tag}"]
        stride = max(1, len(tr) // 50)
        m.curve(f"train_nll_{tag}", range(1, len(tr) + 1, stride), tr[::stride])
        m.curve(f"energy_hist_{tag}", centres, res[f"energy_hist_{tag}"])


def train(ctx) -> None:
    from .efficiency import sample_efficiency

    p = ctx.params
    if ctx.variant not in VARIANT_MEASURE:
        raise ValueError(f"unknown variant {ctx.variant!r}; one of {sorted(VARIANT_MEASURE)}")
    baseline = json.loads((ctx.shared_dir / "ml_sweep.json").read_text())
    measure = VARIANT_MEASURE[ctx.variant]
    if measure is None:  # the baseline was swept once per seed in train_shared
        res = baseline
    else:
        res = sweep(measure, _load_data(ctx.shared_dir), p, ctx.seed, ctx.progress)
        if res["n"] != baseline["n"]:
            raise ValueError("the variant and the baseline were swept over different N grids")
    record(ctx, res, p)
    ratio, censored = sample_efficiency(res["n"], baseline["ess"], res["ess"])
    ctx.metrics.scalar("sample_efficiency", ratio)
    ctx.metrics.scalar("sample_efficiency_censored", float(censored))
    ctx.metrics.curve("ess_gain", res["n"], np.asarray(res["ess"]) / np.maximum(baseline["ess"], 1e-12))
    ctx.progress(f"sample efficiency vs ML at ESS*={max(baseline['ess']):.3f}: {ratio:.2f}x"
                 + (" (lower bound)" if censored else ""))


# --- plots ---------------------------------------------------------------------------------------

def plot(table, plots_dir, params: dict) -> None:
    from ...plotting import curve_plot, plt

    order = ["ml", "ldr_var", "ldr_mad"]
    variants = [v for v in order if v in set(table.variant)]
    target = params.get("target", "dw4").upper()
    curve_plot(table, "ess", plots_dir / "curve_ess.png", logx=True, variants=variants,
               xlabel="training samples N (MCMC)", ylabel="Kish ESS / n (normalised)",
               title=f"{target}: does LDR reach ML's ESS with fewer samples?")
    curve_plot(table, "nll", plots_dir / "curve_nll.png", logx=True, variants=variants,
               xlabel="training samples N (MCMC)", ylabel="test NLL (nats)",
               title=f"{target}: held-out NLL vs training-set size")
    curve_plot(table, "ew2", plots_dir / "curve_ew2.png", logx=True, logy=True, variants=variants,
               xlabel="training samples N (MCMC)", ylabel="E-W2 (kT)",
               title=f"{target}: energy W2 of flow samples vs training-set size")
    curve_plot(table, "final_dispersion", plots_dir / "curve_final_dispersion.png", logx=True, logy=True,
               variants=variants, xlabel="training samples N (MCMC)",
               ylabel="log-dispersion of log q + E/T on training batches",
               title=f"{target}: how constant is log q + E/T on the data?")
    for tag, what in (("nmin", "smallest"), ("nmax", "largest")):
        curve_plot(table, f"val_nll_{tag}", plots_dir / f"curve_val_nll_{tag}.png", variants=variants,
                   xlabel="optimiser step", ylabel="validation NLL (nats)",
                   title=f"{target}: has training flattened at the {what} N?")
    _energy_histograms(table, plots_dir, variants, target, plt())


def _energy_histograms(table, plots_dir, variants, target, p) -> None:
    ref = table[table.metric == "energy_hist_ref"].groupby("x").value.mean()
    if ref.empty:
        return
    fig, axes = p.subplots(1, len(variants), figsize=(4.2 * len(variants), 3.6), squeeze=False, sharey=True)
    for ax, v in zip(axes[0], variants):
        ax.plot(ref.index, ref.values, "k-", lw=2, label="MCMC test set")
        for tag, style in (("nmin", "--"), ("nmax", "-")):
            sub = table[(table.metric == f"energy_hist_{tag}") & (table.variant == v)]
            g = sub.groupby("x").value
            mean, std = g.mean(), g.std().fillna(0.0)
            if mean.empty:
                continue
            n = int(table[(table.metric == "ess") & (table.variant == v)].x.agg("min" if tag == "nmin" else "max"))
            ax.plot(mean.index, mean.values, style, label=f"flow, N={n}")
            ax.fill_between(mean.index, np.maximum(mean - std, 0), mean + std, alpha=0.2)
        ax.set_title(v)
        ax.set_xlabel("energy E (kT)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0, 0].set_ylabel("density (1/kT)")
    fig.suptitle(f"{target}: do flow samples have the target's energies? (mean ± std over seeds)")
    save_figure(fig, plots_dir / "energy_hist.png", dpi=110)
