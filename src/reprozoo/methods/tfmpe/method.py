"""TFMPE in miniature: likelihood-factorised tokenised flow matching vs joint posterior estimation.

Variants (identical tokenised network, initial weights, optimiser, steps, batch, early stopping,
ODE sampler; they differ only in where the posterior's training data come from):

* ``tfmpe`` (method): B single-site simulations -> tokenised likelihood q(x | g, l) -> B synthetic
  S-site data sets -> tokenised posterior. Costs exactly B simulator calls for every S.
* ``joint`` (baseline, equal calls): B / S real S-site data sets (B calls) -> the same posterior.
* ``npe_flat`` (baseline, equal calls): conventional joint NPE, a masked autoregressive flow (zuko,
  blocks/flows.py) over the flattened (g, l_1..S) given the flattened x_1..S, B / S data sets; same
  steps, batch, learning rate, schedule and best-validation rule (maximum likelihood).
* ``joint_sx`` (baseline, S times the calls): B real S-site data sets (S * B calls): as many data
  sets as TFMPE's synthetic ones, so TFMPE can at best match it; "TFMPE needs about S times fewer
  calls" means TFMPE(B) ~ joint_sx(S B).

Problems (``problems`` in the config): ``gauss`` = conjugate hierarchical Gaussian (analytic
posterior: C2ST at one observation x_o per (seed, S) with n_c2st draws each side, pair samples),
``sir`` = chain-binomial SIR sites (no tractable posterior: calibration and posterior-mean error).

Metrics per problem tag and S (``<m>_<tag>_S<S>``):
* ``c2st`` (gauss): sbi's C2ST accuracy of model vs exact posterior draws at x_o (0.5 = identical);
* ``coverage_err``: mean over credibility levels (0.05..0.95) and dimensions of |coverage - level|
  from SBC ranks on n_sets fresh data sets with n_draws posterior draws each; ``coverage`` curve;
  ``sbc_min_p``: smallest per-dimension KS p-value of rank uniformity;
* ``rmse``: RMS error of the posterior mean against the true parameters over the SBC sets, in
  units of the prior sd (gauss: every dimension; sir: the two global parameters);
* ``sim_calls``: simulator calls used for training (one call = one site), counted by the simulator;
* ``val_loss_post`` (curve), ``val_slope_post`` (relative change per 100 steps over the last third
  of training), ``best_step_frac``; ``val_loss_lik_<tag>`` for TFMPE's likelihood.
Evaluation data (x_o, SBC sets) depend on (seed, problem, S) only: every variant sees the same.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from reprozoo.figures import save_figure

PROBLEM_IDS = {"gauss": 0, "sir": 1}
VARIANT_IDS = {"tfmpe": 0, "joint": 1, "joint_sx": 2, "npe_flat": 3}
N_PAIR = 200  # posterior draws kept for the pair plot


def _val_slope(hist: dict) -> float:
    """Relative change of the validation loss per 100 steps over the last third of training."""
    st, va = np.asarray(hist["step"], float), np.asarray(hist["val"], float)
    k = max(2, len(st) // 3)
    if len(st) < 2:
        return float("nan")
    slope = np.polyfit(st[-k:], va[-k:], 1)[0]
    return float(100 * slope / abs(np.mean(va[-k:])))


def _record_fit(ctx, name: str, hist: dict, steps: int) -> None:
    ctx.metrics.curve(f"val_loss_{name}", hist["step"], hist["val"])
    ctx.metrics.curve(f"train_loss_{name}", hist["step"], hist["train"])
    ctx.metrics.scalar(f"val_slope_{name}", _val_slope(hist))
    ctx.metrics.scalar(f"best_step_frac_{name}", hist["best_step"] / steps)


def evaluate(ctx, est, model, tag: str, n_sites: int, p: dict, generator) -> None:
    """C2ST (gauss), SBC coverage, posterior-mean error; evaluation data shared by all variants."""
    from ...blocks.gen_metrics import c2st, expected_coverage, sbc_ranks, sbc_uniformity_pvalue

    ev = p["eval"]
    key = f"{tag}_S{n_sites}"
    rng = np.random.default_rng([ctx.seed, PROBLEM_IDS[tag], n_sites, 99])
    calls0 = model.calls
    if tag == "gauss":
        _, _, x_o = model.sample_joint(1, n_sites, rng)
        ref = model.sample_posterior(x_o[0], ev["n_c2st"], rng)
        q = est.sample(x_o, ev["n_c2st"], generator)[0]
        ctx.metrics.scalar(f"c2st_{key}", c2st(q, ref, seed=ctx.seed))
        mean, cov = model.posterior(x_o[0])
        k = min(N_PAIR, len(q))
        ctx.metrics.curve(f"pair_samples_{key}", range(2 * k), q[:k, :2].ravel())  # (mu, theta_1) interleaved
        for name, v in (("mu_mean", mean[0]), ("th1_mean", mean[1]), ("mu_sd", np.sqrt(cov[0, 0])),
                        ("th1_sd", np.sqrt(cov[1, 1])), ("corr", cov[0, 1] / np.sqrt(cov[0, 0] * cov[1, 1]))):
            ctx.metrics.scalar(f"ref_{name}_{key}", v)
    g, l, x = model.sample_joint(ev["n_sets"], n_sites, rng)
    truth = np.concatenate([g, l.reshape(len(l), -1)], axis=1)
    draws = est.sample(x, ev["n_draws"], generator)
    ranks = sbc_ranks(truth, draws)
    levels, cov = expected_coverage(ranks, ev["n_draws"])
    ctx.metrics.scalar(f"coverage_err_{key}", float(np.abs(cov - levels[:, None]).mean()))
    ctx.metrics.curve(f"coverage_{key}", levels, cov.mean(axis=1))
    ctx.metrics.scalar(f"sbc_min_p_{key}", float(sbc_uniformity_pvalue(ranks, ev["n_draws"], seed=ctx.seed).min()))
    gp, lp = model.sample_prior(4096, n_sites, rng)
    prior_sd = np.concatenate([gp, lp.reshape(len(lp), -1)], axis=1).std(0)
    err = (draws.mean(axis=1) - truth) / prior_sd
    dims = slice(None) if tag == "gauss" else slice(0, model.G)
    ctx.metrics.scalar(f"rmse_{key}", float(np.sqrt((err[:, dims] ** 2).mean())))
    model.calls = calls0  # evaluation simulations are not training cost


def train(ctx) -> None:
    import torch

    from .pipelines import LikelihoodFactorisation, train_flat_npe, train_joint, train_tfmpe
    from .simulators import make_model

    torch.set_num_threads(max(1, ctx.threads))
    p, v = ctx.params, ctx.variant
    if v not in VARIANT_IDS:
        raise ValueError(f"unknown variant {v!r}; one of {sorted(VARIANT_IDS)}")
    budget, net_cfg, ode_steps = p["budget_site_calls"], p["net"], p["ode_steps"]
    fit_post = {**p["fit"], **p["fit_post"]}
    fit_lik = {**p["fit"], **p["fit_lik"]}
    t_all = time.perf_counter()
    for tag, prob in p["problems"].items():
        model = make_model(prob["model"], prob.get("config"))
        pid = PROBLEM_IDS[tag]
        rng = np.random.default_rng([ctx.seed, pid, VARIANT_IDS[v]])
        gen = torch.Generator().manual_seed(int(ctx.seed * 1000 + pid * 10 + VARIANT_IDS[v]))
        lf = None
        if v == "tfmpe":  # one site likelihood, trained once, serves every S
            t0 = time.perf_counter()
            lf = LikelihoodFactorisation(model, budget, net_cfg, fit_lik, ode_steps, rng, gen,
                                         init_seed=ctx.seed * 100 + pid)
            _record_fit(ctx, f"lik_{tag}", lf.hist, fit_lik["steps"])
            ctx.metrics.scalar(f"train_seconds_lik_{tag}", time.perf_counter() - t0)
            ctx.progress(f"{tag}: likelihood from {lf.calls} single-site calls, best val {lf.hist['best_val']:.3f}")
        for n_sites in prob["sites"]:
            key = f"{tag}_S{n_sites}"
            t0 = time.perf_counter()
            init = ctx.seed * 100 + pid * 10 + n_sites  # same initial posterior weights for all variants
            if v == "tfmpe":
                est, hist, calls = train_tfmpe(lf, n_sites, budget, net_cfg, fit_post, init, rng, gen)
            elif v == "npe_flat":
                est, hist, calls = train_flat_npe(model, n_sites, budget // n_sites, p["flat_flow"], fit_post,
                                                  init, rng, gen)
            else:
                n_sets = budget // n_sites if v == "joint" else budget
                est, hist, calls = train_joint(model, n_sites, n_sets, net_cfg, fit_post, ode_steps, init, rng, gen)
            ctx.metrics.scalar(f"train_seconds_{key}", time.perf_counter() - t0)
            ctx.metrics.scalar(f"sim_calls_{key}", calls)
            _record_fit(ctx, f"post_{key}", hist, fit_post["steps"])
            evaluate(ctx, est, model, tag, n_sites, p, gen)
            ctx.progress(f"{key}: {calls} calls, " + ", ".join(
                f"{m} {ctx.metrics.scalars[f'{m}_{key}']:.3f}" for m in ("c2st", "coverage_err", "rmse")
                if f"{m}_{key}" in ctx.metrics.scalars))
    ctx.metrics.scalar("train_seconds", time.perf_counter() - t_all)


# --- plots ---------------------------------------------------------------------------------------

def _keys(table, prefix: str) -> list[str]:
    ks = {m[len(prefix):] for m in table.metric.unique() if m.startswith(prefix)}
    return sorted(ks, key=lambda k: (k.split("_S")[0], int(k.split("_S")[1])))


def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import plt

    p = plt()
    variants = [v for v in VARIANT_IDS if v in set(table.variant)]
    colours = dict(zip(VARIANT_IDS, ("tab:red", "tab:blue", "tab:green", "tab:purple")))
    seed0 = table.seed.min()
    # pair plots (mu, theta_1) against the analytic posterior, seed 0
    for key in _keys(table, "pair_samples_"):
        fig, axes = p.subplots(1, len(variants), figsize=(3.3 * len(variants), 3.3), sharex=True, sharey=True,
                               squeeze=False)
        sc = table[(table.seed == seed0) & table.x.isna()].set_index(["variant", "metric"]).value
        for ax, v in zip(axes[0], variants):
            sub = table[(table.metric == f"pair_samples_{key}") & (table.variant == v) & (table.seed == seed0)]
            xy = sub.sort_values("x").value.to_numpy().reshape(-1, 2)
            ax.scatter(xy[:, 0], xy[:, 1], s=4, alpha=0.5, color=colours[v], label=f"{v} draws")
            try:
                m = np.array([sc[(v, f"ref_mu_mean_{key}")], sc[(v, f"ref_th1_mean_{key}")]])
                sd = np.array([sc[(v, f"ref_mu_sd_{key}")], sc[(v, f"ref_th1_sd_{key}")]])
                r = sc[(v, f"ref_corr_{key}")]
                cov = np.array([[sd[0] ** 2, r * sd[0] * sd[1]], [r * sd[0] * sd[1], sd[1] ** 2]])
                ang = np.linspace(0, 2 * np.pi, 200)
                circ = np.stack([np.cos(ang), np.sin(ang)])
                for k in (1, 2):
                    e = m[:, None] + k * np.linalg.cholesky(cov) @ circ
                    ax.plot(e[0], e[1], "k-" if k == 1 else "k--", lw=1, label=f"analytic {k}σ" if v == variants[0] else None)
                c2 = sc.get((v, f"c2st_{key}"))
                ax.set_title(f"{v}" + (f"  C2ST {c2:.2f}" if c2 is not None else ""), fontsize=9)
            except KeyError:
                ax.set_title(v, fontsize=9)
            ax.set_xlabel("μ (global mean, model units)")
            ax.grid(alpha=0.3)
        axes[0, 0].set_ylabel("θ₁ (site 1 parameter, model units)")
        axes[0, 0].legend(fontsize=6, loc="best")
        fig.suptitle(f"Does the posterior match the analytic one? ({key.replace('_', ', ')}, seed {seed0})", fontsize=10)
        save_figure(fig, plots_dir / f"curve_pair_samples_{key}.png", dpi=110)
    # coverage curves, mean +- sd over seeds
    for key in _keys(table, "coverage_err_"):
        fig, ax = p.subplots(figsize=(4.5, 4.2))
        ax.plot([0, 1], [0, 1], "k:", lw=1, label="calibrated")
        for v in variants:
            g = table[(table.metric == f"coverage_{key}") & (table.variant == v)].groupby("x").value
            mean, sd = g.mean(), g.std().fillna(0.0)
            if mean.empty:
                continue
            ax.plot(mean.index, mean.values, marker="o", ms=3, color=colours[v], label=v)
            ax.fill_between(mean.index, mean - sd, mean + sd, color=colours[v], alpha=0.15)
        ax.set_xlabel("credibility level α")
        ax.set_ylabel("empirical coverage (fraction of true θ inside)")
        ax.set_title(f"Are the posteriors calibrated? SBC coverage, {key.replace('_', ', ')}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        save_figure(fig, plots_dir / f"curve_coverage_{key}.png", dpi=110)
    # C2ST against simulator calls: the "S times fewer calls" picture
    keys = _keys(table, "c2st_")
    if keys:
        fig, axes = p.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.8), squeeze=False)
        for ax, key in zip(axes[0], keys):
            for i, v in enumerate(variants):
                c = table[(table.metric == f"c2st_{key}") & (table.variant == v)].set_index("seed").value
                n = table[(table.metric == f"sim_calls_{key}") & (table.variant == v)].set_index("seed").value
                if c.empty:
                    continue
                n = n * 1.05 ** i  # small offset so variants at the same budget do not hide each other
                ax.errorbar(n.mean(), c.mean(), yerr=c.std() if len(c) > 1 else 0, fmt="o", color=colours[v],
                            capsize=3, label=v)
                ax.scatter(n.reindex(c.index), c, s=8, color=colours[v], alpha=0.4)
            ax.axhline(0.5, color="k", ls=":", lw=1)
            ax.set_xscale("log")
            ax.set_xlabel("simulator calls for training (sites simulated)")
            ax.set_ylabel("C2ST vs analytic posterior (0.5 = exact)")
            ax.set_title(key.replace("_", ", "), fontsize=9)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
        fig.suptitle("How many simulator calls buy how accurate a posterior?", fontsize=10)
        save_figure(fig, plots_dir / "c2st_vs_calls.png", dpi=110)
