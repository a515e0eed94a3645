"""Figures of the depth sweep, drawn from the long metrics table only.

- ``error_vs_depth.png``: relative L2 error vs depth L per architecture, mean over seeds with a
  min-max seed band, one panel per PDE (does the error grow with depth?);
- ``derivative_profiles.png``: per-layer ||dh_l/dx|| and ||d2h_l/dx2|| at the deepest L, at
  initialisation and after training, seed bands (do the differentials vanish / explode?);
- ``fields_<pde>.png``: prediction, reference and pointwise error at the deepest L, seed 0, for
  each architecture (where does the deep PINN go wrong?);
- ``training_curves.png``: residual loss and validation error vs step at the deepest L.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

COLORS = {"coupling": "tab:green", "mlp": "tab:red", "resnet": "tab:blue"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _scalar(table, metric):
    t = table[(table.metric == metric)]
    return t.groupby("variant").value.apply(list).to_dict()


def _curve_stats(table, metric, variant):
    t = table[(table.metric == metric) & (table.variant == variant)]
    if t.empty:
        return None
    piv = t.pivot_table(index="x", columns="seed", values="value")
    return piv.index.to_numpy(), piv.to_numpy()


def _depths_and_pdes(table):
    depths, pdes = set(), set()
    for m in table.metric.unique():
        g = re.fullmatch(r"err_(.+)_L(\d+)", m)
        if g:
            pdes.add(g.group(1)), depths.add(int(g.group(2)))
    return sorted(depths), sorted(pdes)


def draw_all(table, plots_dir: Path, params: dict) -> None:
    plots_dir.mkdir(parents=True, exist_ok=True)
    depths, pdes = _depths_and_pdes(table)
    if not depths:
        return
    variants = [v for v in ("coupling", "mlp", "resnet") if v in set(table.variant)]
    plt = _plt()
    deep = max(depths)

    # error vs depth
    fig, axes = plt.subplots(1, len(pdes), figsize=(4.2 * len(pdes), 3.4), squeeze=False)
    for ax, pde in zip(axes[0], pdes):
        for v in variants:
            got = {d: np.asarray(_scalar(table, f"err_{pde}_L{d}")[v], float) for d in depths
                   if v in _scalar(table, f"err_{pde}_L{d}")}  # the depths this variant trains
            ds, vals = list(got), list(got.values())
            if not ds:
                continue
            mean = [np.exp(np.mean(np.log(x))) for x in vals]
            ax.plot(ds, mean, "o-", color=COLORS[v], label=v)
            ax.fill_between(ds, [x.min() for x in vals], [x.max() for x in vals], color=COLORS[v], alpha=0.2)
        ax.set_xscale("log", base=2), ax.set_yscale("log")
        ax.set_xticks(depths, [str(d) for d in depths])
        ax.set_xlabel("depth L (hidden blocks)"), ax.set_ylabel("relative L2 error (dimensionless)")
        ax.set_title(pde)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Does the PINN error grow with depth? (geometric mean over seeds, band = min-max)")
    fig.tight_layout(), fig.savefig(plots_dir / "error_vs_depth.png", dpi=100), plt.close(fig)

    # derivative profiles at the deepest depth
    fig, axes = plt.subplots(len(pdes), 4, figsize=(15, 3.0 * len(pdes)), squeeze=False)
    for i, pde in enumerate(pdes):
        for j, (order, stage) in enumerate([("du", "init"), ("du", "trained"), ("d2u", "init"), ("d2u", "trained")]):
            ax = axes[i][j]
            for v in variants:
                st = _curve_stats(table, f"prof_{order}_{stage}_{pde}_L{deep}", v)
                if st is None:
                    continue
                x, y = st
                ax.plot(x, np.exp(np.log(y).mean(axis=1)), color=COLORS[v], label=v)
                ax.fill_between(x, y.min(axis=1), y.max(axis=1), color=COLORS[v], alpha=0.2)
            ax.set_yscale("log")
            ax.set_xlabel("layer l (0 = lifting)")
            ax.set_ylabel(("mean ||dh_l/dx||" if order == "du" else "mean ||d2h_l/dx2||") + " (per unit x^k)")
            ax.set_title(f"{pde}, L={deep}, {stage}")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Do input derivatives vanish or explode through depth? (per-layer norms, band = seeds)")
    fig.tight_layout(), fig.savefig(plots_dir / "derivative_profiles.png", dpi=100), plt.close(fig)

    # fields: prediction, reference, error (seed 0, deepest L)
    seed0 = int(table.seed.min())
    for pde in pdes:
        ref = table[(table.metric == f"ref_{pde}") & (table.seed == seed0)]
        if ref.empty:
            continue
        ref = ref.drop_duplicates("x").sort_values("x").value.to_numpy()
        pde_cfg = (params.get("pde_config") or {}).get(pde, {})
        n_t = int(pde_cfg.get("n_eval_t", 0)) if pde in ("burgers", "allen_cahn") else 0
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
        for v in variants:
            t = table[(table.metric == f"field_{pde}_L{deep}") & (table.variant == v) & (table.seed == seed0)]
            if t.empty:
                continue
            u = t.sort_values("x").value.to_numpy()
            if n_t:  # space-time: show the final time slice
                u, r = u.reshape(n_t, -1)[-1], ref.reshape(n_t, -1)[-1]
            else:
                r = ref
            xs = np.linspace(0, 1, len(r)) if not n_t else np.arange(len(r)) * 2 * np.pi / len(r)
            axes[0].plot(xs, u, color=COLORS[v], label=v)
            axes[2].semilogy(xs, np.abs(u - r) + 1e-12, color=COLORS[v], label=v)
        r = ref if not n_t else ref.reshape(n_t, -1)[-1]
        xs = np.linspace(0, 1, len(r)) if not n_t else np.arange(len(r)) * 2 * np.pi / len(r)
        axes[1].plot(xs, r, "k")
        for ax, title in zip(axes, ["PINN prediction u", "reference u", "|error|"]):
            ax.set_xlabel("x (dimensionless)"), ax.set_title(title + ("" if not n_t else " at t = T"))
        axes[0].set_ylabel("u (dimensionless)"), axes[2].set_ylabel("|u - u_ref|")
        axes[0].legend(fontsize=8)
        fig.suptitle(f"Where does the L={deep} PINN miss the {pde} solution? (seed {seed0})")
        fig.tight_layout(), fig.savefig(plots_dir / f"fields_{pde}.png", dpi=100), plt.close(fig)

    # training curves
    fig, axes = plt.subplots(2, len(pdes), figsize=(4.2 * len(pdes), 6), squeeze=False)
    for j, pde in enumerate(pdes):
        for i, (name, lab) in enumerate([("loss", "mean squared residual"), ("valerr", "relative L2 error")]):
            ax = axes[i][j]
            for v in variants:
                st = _curve_stats(table, f"{name}_{pde}_L{deep}", v)
                if st is None:
                    continue
                x, y = st
                ax.plot(x, np.exp(np.log(y).mean(axis=1)), color=COLORS[v], label=v)
                ax.fill_between(x, y.min(axis=1), y.max(axis=1), color=COLORS[v], alpha=0.2)
            ax.set_yscale("log"), ax.set_xlabel("training step"), ax.set_ylabel(lab + " (dimensionless)")
            ax.set_title(f"{pde}, L={deep}")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Has every model stopped improving within the step budget?")
    fig.tight_layout(), fig.savefig(plots_dir / "training_curves.png", dpi=100), plt.close(fig)
