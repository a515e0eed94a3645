"""Figures: the kink's position over the long horizon, energy, state error with seed bands, a
snapshot, and how many PSD modes the reconstruction needs.

Every figure reads the long table only (columns method, variant, seed, metric, x, value).
"""
from __future__ import annotations

from pathlib import Path

ORDER = ["ro_hnn", "sae_ghnn", "sae_node", "psd_hnn", "psd8_galerkin", "ae_hnn", "ae_node", "full_hnn"]
COLORS = {"ro_hnn": "tab:red", "sae_ghnn": "tab:brown", "sae_node": "tab:olive", "psd_hnn": "tab:blue", "ae_node": "tab:green",
          "psd8_galerkin": "tab:purple", "ae_hnn": "tab:orange", "full_hnn": "tab:gray"}


def _variants(table):
    present = set(table.variant.unique())
    return [v for v in ORDER if v in present]


def _one(table, metric, variant, seed):
    sub = table[(table.metric == metric) & (table.variant == variant) & (table.seed == seed)].sort_values("x")
    return sub.x.to_numpy(), sub.value.to_numpy()


def _band(ax, table, metric, variant, t_train):
    sub = table[(table.metric == metric) & (table.variant == variant)]
    if sub.empty:
        return
    wide = sub.pivot_table(index="x", columns="seed", values="value")
    x, m = wide.index.to_numpy() / t_train, wide.mean(1).to_numpy()
    ax.plot(x, m, color=COLORS[variant], label=f"{variant} (mean of {wide.shape[1]} seeds)")
    if wide.shape[1] > 1:
        ax.fill_between(x, wide.min(1), wide.max(1), color=COLORS[variant], alpha=0.2, lw=0)


def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import plt

    pyplot = plt()
    plots_dir = Path(plots_dir)
    t_train = float(params.get("t_train", 1.0))
    variants = _variants(table)
    if not variants:
        return
    seed = int(table.seed.min())

    fig, ax = pyplot.subplots(figsize=(9, 4))
    x, k = _one(table, "kink_x_true", variants[0], seed)
    ax.plot(x / t_train, k, color="k", lw=2.5, label="leapfrog reference")
    for v in variants:
        x, k = _one(table, "kink_x", v, seed)
        ax.plot(x / t_train, k, color=COLORS[v], lw=1.2, label=v)
    ax.axvline(1.0, color="grey", ls=":", lw=1)
    system = params.get("system", {})
    if "n" in system and "a" in system:  # the chain's extent: a prediction that leaves it runs off the plot
        half = 0.5 * float(system["n"]) * float(system["a"])
        ax.set_ylim(-half, half)
    ax.set(xlabel="time / training horizon T", ylabel="kink position X (read off the decoded state)",
           title=f"Where is the kink? One held-out trajectory over 10 T (seed {seed})")
    ax.legend(fontsize=8, ncol=5)
    fig.savefig(plots_dir / "curve_kink_x.png", dpi=110, bbox_inches="tight")
    pyplot.close(fig)

    fig, axes = pyplot.subplots(1, 2, figsize=(11, 4))
    for v in variants:
        x, e = _one(table, "excitation_ratio", v, seed)
        axes[0].plot(x / t_train, e, color=COLORS[v], label=v)
    axes[0].axhline(1.0, color="k", lw=2, label="reference (conserved)")
    axes[0].set(xlabel="time / training horizon T", ylabel="(H(x_hat) - E_rest) / (H(x0) - E_rest)",
                title=f"one held-out trajectory (seed {seed}; y clipped to [0, 3])", ylim=(0.0, 3.0))
    for v in variants:
        _band(axes[1], table, "energy_err", v, t_train)
    axes[1].set(xlabel="time / training horizon T", ylabel="|H(x_hat(t)) - <H(D(E(x)))>| / (H0 - E_rest)",
                yscale="log",
                title="mean over held-out trajectories (band: seed min-max)")
    for ax in axes:
        ax.axvline(1.0, color="grey", ls=":", lw=1)
        ax.legend(fontsize=8)
    fig.suptitle("Does the decoded prediction keep the chain's energy over 10x the training horizon?")
    fig.savefig(plots_dir / "curve_energy_err.png", dpi=110, bbox_inches="tight")
    pyplot.close(fig)

    fig, ax = pyplot.subplots(figsize=(6.5, 4.2))
    for v in variants:
        _band(ax, table, "state_err", v, t_train)
    ax.axvline(1.0, color="grey", ls=":", lw=1, label="end of training horizon")
    ax.set(xlabel="time / training horizon T", ylabel="relative state error (1: time-mean prediction)",
           yscale="log", title="Which model tracks the 96-dim kink chain longest?")
    ax.legend(fontsize=8)
    fig.savefig(plots_dir / "curve_state_err.png", dpi=110, bbox_inches="tight")
    pyplot.close(fig)

    fig, ax = pyplot.subplots(figsize=(7, 4))
    i, q = _one(table, "snapshot_q_true", variants[0], seed)
    ax.plot(i, q, color="k", lw=2.5, label="leapfrog reference")
    for v in variants:
        i, q = _one(table, "snapshot_q", v, seed)
        ax.plot(i, q, color=COLORS[v], marker=".", ms=3, label=v)
    ax.set(xlabel="site index i", ylabel="angle q_i",
           title=f"Chain at t = 10T: true vs predicted (seed {seed}, trajectory 0)")
    ax.legend(fontsize=8)
    fig.savefig(plots_dir / "curve_snapshot_q.png", dpi=110, bbox_inches="tight")
    pyplot.close(fig)

    if "psd_hnn" in variants:
        fig, ax = pyplot.subplots(figsize=(6, 4))
        _band(ax, table, "psd_recon_vs_modes", "psd_hnn", 1.0)
        sub = table[(table.metric == "recon_err") & (table.variant == "ro_hnn") & table.x.isna()]
        if not sub.empty:
            ax.axhline(float(sub.value.mean()), color=COLORS["ro_hnn"], ls="--",
                       label="symplectic AE, n = 1 (mean over seeds)")
        ax.set(xscale="log", yscale="log", xlabel="PSD latent degrees of freedom n",
               ylabel="test reconstruction error (state error, no dynamics)",
               title="How many linear modes match one nonlinear coordinate?")
        ax.legend(fontsize=8)
        fig.savefig(plots_dir / "curve_psd_recon_vs_modes.png", dpi=110, bbox_inches="tight")
        pyplot.close(fig)
