"""Verbalized Bayesian persuasion in miniature: classic games, a verbal PSRO loop, exact references.

Variants (one cell per variant x seed; every variant plays the same three games, with the same
lexicon receiver and the same number of evaluation dialogues):
  vbp_psro          the paper's loop: PSRO over verbalized schemes and deviation rules with the
                    verbalized commitment (the receiver reads the scheme), obedience penalty lam
                    and obfuscated messages; sender proposals from the TemplateSender or an LLM
  vbp_no_obedience  the same loop with lam = 0: the sender's solver ignores the receiver's incentives
  vbp_no_obfuscation the same loop with the mixture's draw revealed to the receiver: the sender can
                    only commit to one scheme written on the 5 % verbal grid (courtroom: 0.58 at best)
  truthful          baseline: the fully revealing scheme, written in words, same dialogues
  babbling          baseline: an uninformative scheme (50 / 50 in every state), same dialogues

Per game g the cell records
  u_<g>               sender utility in n_dialogues verbal episodes (P(receiver takes the sender's
                      preferred action), a probability), the headline number
  gap_<g>             u_<g> - lp_<g>; lp_<g> the LP optimum, concav_<g> the concavification value,
                      truthful_<g> / babbling_<g> the exact values of the two reference schemes
  obedience_rate_<g>  fraction of episodes where the receiver did what the message recommended
  violation_<g>       receiver's exact gain from disobeying the committed scheme (0 = obedient)
  curve sender_utility_<g>: realized sender utility of the committed PSRO mixture per iteration
Agents: the sender and receiver go through reprozoo.blocks.llm_backend.backend_from_env, so setting
REPROZOO_LLM_BASE_URL (+ _MODEL, _API_KEY) replaces the offline agents by an OpenAI-compatible model.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...blocks.llm_backend import ENV_URL, backend_from_env
from .games import GAMES
from .psro import play_dialogues, run_psro
from .solvers import (babbling_scheme, concavify_binary, lp_optimum, max_violation,
                      realized_sender_utility, truthful_scheme)
from .verbal import LexiconReceiver, TemplateSender, verbalize_scheme
from reprozoo.figures import save_figure

LAMBDA = {"vbp_psro": None, "vbp_no_obedience": 0.0, "vbp_no_obfuscation": None}
GENERIC_CURVES: list[str] = []  # plot() draws the PSRO curves with the reference lines
FIXED = {"truthful": truthful_scheme, "babbling": babbling_scheme}


def agents(p: dict):
    """(sender, receiver) backends: offline agents unless the environment names a model."""
    import os

    if p.get("require_llm") and not os.environ.get(ENV_URL):
        raise RuntimeError(f"this scale asks for a language model: set ${ENV_URL}, REPROZOO_LLM_MODEL "
                           "(and REPROZOO_LLM_API_KEY) to an OpenAI-compatible endpoint, or run scale smoke")
    sender = backend_from_env(TemplateSender(p_fresh=float(p["p_fresh"])), timeout_s=float(p.get("timeout_s", 60)))
    receiver = backend_from_env(LexiconReceiver(), timeout_s=float(p.get("timeout_s", 60)))
    if p.get("receiver") == "lexicon":  # keep the exact Bayesian receiver even with a model configured
        receiver = LexiconReceiver()
    return sender, receiver


def train(ctx) -> None:
    p, m = ctx.params, ctx.metrics
    sender, receiver = agents(p)
    m.scalar("llm_backend", float(not isinstance(sender, TemplateSender)))
    for gi, name in enumerate(p["games"]):
        game = GAMES[name]
        rng = ctx.rng(gi)
        lp, _ = lp_optimum(game)
        m.scalar(f"lp_{name}", lp)
        m.scalar(f"concav_{name}", concavify_binary(game))
        m.scalar(f"truthful_{name}", realized_sender_utility(game, truthful_scheme(game)))
        m.scalar(f"babbling_{name}", realized_sender_utility(game, babbling_scheme(game)))
        if ctx.variant in LAMBDA:
            lam = float(p["lam"]) if LAMBDA[ctx.variant] is None else LAMBDA[ctx.variant]
            out = run_psro(game, p, rng, sender, lam, progress=ctx.progress,
                           reveal_draw=ctx.variant == "vbp_no_obfuscation")
            commitment, pi = out["commitment"], out["pi"]
            its = list(range(len(out["curve"])))
            m.curve(f"sender_utility_{name}", its, out["curve"])
            m.curve(f"meta_value_{name}", its, out["meta_values"])
            m.scalar(f"parse_failures_{name}", out["parse_failures"])
            m.scalar(f"n_schemes_{name}", out["n_schemes"])
            tol = float(p["tolerance"])
            hit = [i for i, u in enumerate(out["curve"]) if abs(u - lp) <= tol]
            m.scalar(f"iters_to_tol_{name}", hit[0] if hit else float("nan"))
            tail = np.asarray(out["curve"][-max(2, len(its) // 5):])
            m.scalar(f"final_slope_{name}", float(np.polyfit(np.arange(len(tail)), tail, 1)[0]))
        else:
            pi = FIXED[ctx.variant](game)
            commitment = verbalize_scheme(game, pi, rng)
        m.scalar(f"u_exact_{name}", realized_sender_utility(game, pi))
        m.scalar(f"violation_{name}", max_violation(game, pi))
        d = play_dialogues(game, commitment, int(p["n_dialogues"]), rng, receiver)
        m.scalar(f"u_{name}", d["sender_utility"])
        m.scalar(f"gap_{name}", d["sender_utility"] - lp)
        m.scalar(f"obedience_rate_{name}", d["obedience_rate"])
        m.scalar(f"receiver_utility_{name}", d["receiver_utility"])
        (ctx.outdir / f"commitment_{name}.txt").write_text(commitment + "\n")
        ctx.progress(f"{name}: dialogues U_s {d['sender_utility']:.4f} (LP {lp:.4f}), "
                     f"obedience {d['obedience_rate']:.4f}")


def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import plt

    pyplot = plt()
    games = list(params["games"])
    fig, axes = pyplot.subplots(1, len(games), figsize=(5 * len(games), 4), squeeze=False)
    for ax, name in zip(axes[0], games):
        sub = table[table.metric == f"sender_utility_{name}"]
        for variant, color in (("vbp_psro", "C0"), ("vbp_no_obedience", "C3"), ("vbp_no_obfuscation", "C1")):
            g = sub[sub.variant == variant].groupby("x").value
            if g.ngroups == 0:
                continue
            mean, lo, hi = g.mean(), g.min(), g.max()
            ax.plot(mean.index, mean.values, color=color, label=f"{variant} (mean, band = min-max over seeds)")
            ax.fill_between(mean.index, lo.values, hi.values, color=color, alpha=0.2)
        refs = table[table.x.isna()]
        for metric, style, label in ((f"lp_{name}", "k-", "LP optimum"), (f"truthful_{name}", "g--", "truthful"),
                                     (f"babbling_{name}", "m:", "babbling")):
            vals = refs[refs.metric == metric].value
            if len(vals):
                ax.axhline(float(vals.mean()), color=style[0], ls=style[1:], lw=1.2, label=label)
        ax.set_xlabel("PSRO iteration")
        ax.set_ylabel("sender utility (P(receiver takes sender's action))")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"{name}: does verbalized PSRO reach the LP optimum?", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6, loc="center right")
    save_figure(fig, plots_dir / "psro_sender_utility.png", dpi=110)

    rows = table[(table.metric.str.startswith("u_")) & ~table.metric.str.startswith("u_exact") & table.x.isna()]
    if rows.empty:
        return
    variants = [v for v in ("vbp_psro", "vbp_no_obedience", "vbp_no_obfuscation", "truthful", "babbling") if v in set(rows.variant)]
    fig, ax = pyplot.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(variants))
    for k, v in enumerate(variants):
        means, errs = [], []
        for name in games:
            vals = rows[(rows.variant == v) & (rows.metric == f"u_{name}")].value
            means.append(vals.mean())
            errs.append(vals.std() if len(vals) > 1 else 0.0)
        ax.bar(np.arange(len(games)) + k * width, means, width, yerr=errs, label=v)
    lps = [table[(table.metric == f"lp_{n}")].value.mean() for n in games]
    ax.scatter(np.arange(len(games)) + 0.4 - width / 2, lps, marker="_", s=900, color="k", label="LP optimum")
    ax.set_xticks(np.arange(len(games)) + 0.4 - width / 2, games, fontsize=8)
    ax.set_ylabel("sender utility in verbal dialogues (probability)")
    ax.set_title("Which schemes persuade? dialogue utility per game (mean +- std over seeds)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    save_figure(fig, plots_dir / "dialogue_utility.png", dpi=110)
