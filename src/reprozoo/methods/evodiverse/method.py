"""EvoDiverse in miniature: tempered populations with replica exchange vs one greedy population.

Variants (one search per task per cell, all at the same oracle budget, same initial hypotheses):
    evodiverse  populations at inverse temperatures betas (0.8 cold, 0.2 hot) + replica exchange
    pt_noswap   ablation: the same two populations, never exchanged
    greedy      baseline: one population of the same total size, truncation survival

Stages
    train_shared  per seed: the sampled data of each Feynman formula (in-range points the oracle
                  fits, and out-of-range points that re-validate the final hypotheses)
    train         per variant x seed: equation discovery on each formula, then circle packing

Metrics (quality units: decades of NMSE for formulas, sum of radii for packings)
    eq_topk_quality, eq_diversity       mean over formulas of the top-k quality / mean pairwise
                                        subtree-Jaccard distance of the final populations' top-k
    eq_best, eq_recovered               best quality; fraction of formulas found exactly (q >= 10)
    eq_ood_topk_quality                 the same top-k re-validated on out-of-range points (the
                                        "more expensive downstream validation" of the paper)
    cp_topk_quality, cp_diversity       the same for the packing (matched-centre distance, unit square)
    *_archive_*                         the same over everything evaluated, not only the final set
    *_best_vs_calls (curves)            best quality against oracle calls
    *_front_quality / *_front_diversity top-k quality and diversity for k in front_ks
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...io import save_npz
from .expressions import evaluate, parse
from .proposers import LLMProposer, make_proposer
from .search import Candidate, run_variant, top_k_diversity
from .tasks import FEYNMAN, CirclePackingTask, EquationTask, lp_radii, metric_name
from reprozoo.figures import save_figure

GENERIC_CURVES: list[str] = []  # every curve is drawn by plot() below


# --- shared per seed: the data -----------------------------------------------------------------------

def ood_ranges(formula_id: str, stretch: float):
    """Each range [lo, hi] extended to [hi, hi + stretch * (hi - lo)]: points never fitted."""
    return tuple((hi, hi + stretch * (hi - lo)) for lo, hi in FEYNMAN[formula_id][1])


def train_shared(ctx) -> None:
    p = ctx.params
    arrays = {}
    for i, fid in enumerate(p["formulas"]):
        rng = ctx.rng(10 + i)
        task = EquationTask.sample(fid, p["n_points"], rng, noise=p["noise"])
        names, _, truth = FEYNMAN[fid]
        lo, hi = np.array(ood_ranges(fid, p["ood_stretch"])).T
        X_ood = rng.uniform(lo, hi, size=(p["n_points"], len(names)))
        y_ood = evaluate(parse(truth, names), X_ood)
        arrays |= {f"{fid}/X": task.X, f"{fid}/y": task.y, f"{fid}/X_ood": X_ood, f"{fid}/y_ood": y_ood}
    save_npz(ctx.outdir / "formulas.npz", **arrays)
    ctx.metrics.scalar("n_points", p["n_points"])


# --- per variant -------------------------------------------------------------------------------------

def checkpoints(budget: int, n: int = 20) -> np.ndarray:
    return np.unique(np.linspace(budget / n, budget, n).astype(int))


def summarise(ctx, prefix: str, task, oracle, final: list[Candidate], p) -> dict:
    """Record top-k quality / diversity of the final set and of the archive, the front over k
    and best-vs-calls; return the headline numbers."""
    k = p["top_k"]
    top, arch = final[:k], oracle.top_k(k)
    out = {
        "topk_quality": float(np.mean([c.quality for c in top])),
        "diversity": top_k_diversity(task, top),
        "best": max(c.quality for c in final),
        "archive_topk_quality": float(np.mean([c.quality for c in arch])),
        "archive_diversity": top_k_diversity(task, arch),
    }
    for name, value in out.items():
        ctx.metrics.scalar(f"{prefix}_{name}", value)
    ks = [kk for kk in p["front_ks"] if kk <= len(final)]
    ctx.metrics.curve(f"{prefix}_front_quality", ks, [np.mean([c.quality for c in final[:kk]]) for kk in ks])
    ctx.metrics.curve(f"{prefix}_front_diversity", ks, [top_k_diversity(task, final[:kk]) for kk in ks])
    xs = checkpoints(oracle.budget)
    best = np.asarray(oracle.best_per_call)
    ctx.metrics.curve(f"{prefix}_best_vs_calls", xs, best[np.minimum(xs, len(best)) - 1])
    out["best_curve"] = best[np.minimum(xs, len(best)) - 1]
    return out


def _search(ctx, task, p, budget: int, offset: int):
    # the initial hypotheses depend on the seed and the task only: every variant starts from them
    init_rng = ctx.rng(offset)
    initial = [task.random(init_rng) for _ in range(p["pop_size"] * len(p["betas"]))]
    proposer = make_proposer(task, p["proposer"], p["p_crossover"], p["llm_temperature"])
    cfg = {**p, "budget": budget, "populations": len(p["betas"])}
    oracle, info = run_variant(ctx.variant, task, proposer, cfg, initial, ctx.rng(offset + 1))
    if isinstance(proposer, LLMProposer):
        ctx.metrics.scalar("llm_calls", ctx.metrics.scalars.get("llm_calls", 0) + proposer.calls)
        ctx.metrics.scalar("llm_parse_failures",
                           ctx.metrics.scalars.get("llm_parse_failures", 0) + proposer.failures)
    return oracle, info


def train(ctx) -> None:
    p = ctx.params
    data = np.load(ctx.shared_dir / "formulas.npz")
    per_formula = []
    for i, fid in enumerate(p["formulas"]):
        task = EquationTask(fid, data[f"{fid}/X"], data[f"{fid}/y"], max_size=p["max_size"])
        oracle, info = _search(ctx, task, p, p["eq_budget"], 100 * (i + 1))
        m = f"eq_{metric_name(fid)}"
        res = summarise(ctx, m, task, oracle, info["final"], p)
        ood = EquationTask(fid, data[f"{fid}/X_ood"], data[f"{fid}/y_ood"])
        res["ood_topk_quality"] = float(np.mean([ood.score(c.genome)[0] for c in info["final"][:p["top_k"]]]))
        res["recovered"] = float(res["best"] >= 10.0)
        ctx.metrics.scalar(f"{m}_ood_topk_quality", res["ood_topk_quality"])
        ctx.metrics.scalar(f"{m}_swap_rate", info["swap_rate"])
        per_formula.append(res)
        ctx.progress(f"{fid}: best {res['best']:.2f} decades, top-{p['top_k']} {res['topk_quality']:.2f}, "
                     f"diversity {res['diversity']:.3f}, best formula {task.to_text(info['final'][0].genome)}")
    for name in ("topk_quality", "diversity", "best", "archive_topk_quality", "archive_diversity",
                 "ood_topk_quality", "recovered"):
        ctx.metrics.scalar(f"eq_{name}", float(np.mean([r[name] for r in per_formula])))
    xs = checkpoints(p["eq_budget"])
    ctx.metrics.curve("eq_best_vs_calls", xs, np.mean([r["best_curve"] for r in per_formula], axis=0))

    task = CirclePackingTask(p["n_circles"], crowd_sigma=p["cp_crowd_sigma"])
    oracle, info = _search(ctx, task, p, p["cp_budget"], 9000)
    res = summarise(ctx, "cp", task, oracle, info["final"], p)
    ctx.metrics.scalar("cp_swap_rate", info["swap_rate"])
    best = info["final"][0].genome
    r = lp_radii(best)
    idx = np.arange(len(best))
    ctx.metrics.curve("cp_best_cx", idx, best[:, 0])
    ctx.metrics.curve("cp_best_cy", idx, best[:, 1])
    ctx.metrics.curve("cp_best_r", idx, r)
    save_npz(ctx.outdir / "best_packing.npz", centres=best, radii=r)
    ctx.progress(f"circle packing n={p['n_circles']}: best sum of radii {res['best']:.4f}, "
                 f"top-{p['top_k']} {res['topk_quality']:.4f}, diversity {res['diversity']:.4f}")


# --- plots -------------------------------------------------------------------------------------------

_COLORS = {"evodiverse": "C0", "pt_noswap": "C2", "greedy": "C3"}


def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot, plt

    k = params.get("top_k", 10)
    curve_plot(table, "eq_best_vs_calls", plots_dir / "curve_eq_best_vs_calls.png",
               xlabel="oracle calls", ylabel="best quality, -log10 NMSE (decades; mean over formulas)",
               title="Equation discovery: best hypothesis vs oracle calls (mean +- std over seeds)")
    curve_plot(table, "cp_best_vs_calls", plots_dir / "curve_cp_best_vs_calls.png",
               xlabel="oracle calls", ylabel="best sum of radii (unit square)",
               title=f"Circle packing (n = {params.get('n_circles')}): best vs oracle calls")

    # quality-diversity fronts: top-k quality against top-k diversity, k = front_ks, per variant
    p = plt()
    fig, axes = p.subplots(1, 2, figsize=(11, 4.2))
    for ax, prefix, qlab, dlab in ((axes[0], "eq", "top-k quality (decades of NMSE, mean over formulas)",
                                    "top-k diversity (subtree Jaccard distance)"),
                                   (axes[1], "cp", "top-k quality (sum of radii)",
                                    "top-k diversity (matched centre distance, unit square)")):
        if prefix == "eq":
            fq = table[table.metric.str.match(r"eq_i.*_front_quality")]
            fd = table[table.metric.str.match(r"eq_i.*_front_diversity")]
        else:
            fq, fd = table[table.metric == "cp_front_quality"], table[table.metric == "cp_front_diversity"]
        for v in sorted(fq.variant.unique()):
            q = fq[fq.variant == v].groupby("x").value.mean()
            d = fd[fd.variant == v].groupby("x").value.mean()
            ax.plot(d.values, q.values, "o-", color=_COLORS.get(v), label=v, ms=4)
            for kk, dx, qy in zip(q.index, d.values, q.values):
                ax.annotate(f"k={int(kk)}", (dx, qy), fontsize=6, alpha=0.7)
            sq = table[(table.metric == f"{prefix}_topk_quality") & (table.variant == v)].value
            sd = table[(table.metric == f"{prefix}_diversity") & (table.variant == v)].value
            ax.scatter(sd, sq, color=_COLORS.get(v), marker="x", s=20, alpha=0.6)
        ax.set_xlabel(dlab)
        ax.set_ylabel(qlab)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_title("Equation discovery: more diverse at equal quality?", fontsize=9)
    axes[1].set_title(f"Circle packing: more diverse at equal quality? (x: top-{k} per seed)", fontsize=9)
    save_figure(fig, plots_dir / "qd_fronts.png", dpi=110)

    # the best packing of each variant (best seed)
    sub = table[table.metric == "cp_best"]
    variants = sorted(sub.variant.unique())
    if variants:
        fig, axes = p.subplots(1, len(variants), figsize=(3.6 * len(variants), 3.8), squeeze=False)
        for ax, v in zip(axes[0], variants):
            row = sub[sub.variant == v].sort_values("value").iloc[-1]
            seed = row.seed
            get = lambda m: table[(table.metric == m) & (table.variant == v) & (table.seed == seed)].sort_values("x").value.to_numpy()  # noqa: E731
            cx, cy, r = get("cp_best_cx"), get("cp_best_cy"), get("cp_best_r")
            for x, y, rr in zip(cx, cy, r):
                ax.add_patch(p.Circle((x, y), rr, fill=True, alpha=0.35, color=_COLORS.get(v), ec="k", lw=0.5))
            ax.plot([0, 1, 1, 0, 0], [0, 0, 1, 1, 0], "k-", lw=1)
            ax.set_xlim(-0.02, 1.02)
            ax.set_ylim(-0.02, 1.02)
            ax.set_aspect("equal")
            ax.set_title(f"{v} (seed {int(seed)}): sum r = {row.value:.4f}", fontsize=8)
            ax.set_xlabel("x (unit square)")
            ax.set_ylabel("y (unit square)")
        fig.suptitle("Best circle packing found by each variant at equal oracle budget", fontsize=9)
        save_figure(fig, plots_dir / "best_packing.png", dpi=110)
