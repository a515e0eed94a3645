"""Verbalized Bayesian persuasion in miniature: classic games, a receiver that can misread, a verbal
PSRO loop, exact references.

The receiver is a bounded-rational interpreter of the text (verbal.NoisyReader): it reads the
committed scheme and the message, and misjudges the posterior by ``noise`` in log-odds, afresh in
every dialogue. Each cell plays every game against three such channels (``channels`` in the
config: low / mid / high noise), so the words matter: a scheme whose posterior sits exactly at the
receiver's threshold (the exact BP optimum) persuades only half of the time.

Variants (one cell per variant x seed; every variant plays the same games and channels, and is
scored on the same test dialogues: states, recommendation draws, paraphrases and noise draws are
common random numbers, drawn from the seed, never from the variant):
  vbp_psro         the paper's loop: PSRO over verbalized schemes and deviation rules, meta-game
                   payoffs measured in verbal play with the receiver on training dialogues, the
                   verbalized obedience penalty lam and obfuscated mixture commitments; sender
                   proposals from the TemplateSender or an LLM
  vbp_exact_model  baseline, numeric BP: the same loop, proposals, penalty and iterations, but the
                   sender's payoff is the game solver's model of an exact, obedient Bayesian receiver
                   (no dialogue is played while solving): it converges to the LP optimum of theory
  truthful         baseline: the fully revealing scheme, written in words
  babbling         baseline: an uninformative scheme (50 / 50 in every state), in words

Per game g and channel c (key k = <g>_<c>) the cell records
  u_<k>               per test dialogue (units): 1 if the receiver took the sender's preferred action
  ustar_<k>           per test dialogue: the same for the oracle scheme, the best obedient scheme on
                      the verbal grid against this receiver (solvers.channel_oracle, which knows the
                      receiver's noise model; the loop does not)
  obedience_rate_<k>  per test dialogue: 1 if the receiver did what the message recommended
  receiver_utility_<k>, u_channel_exact_<k> (the committed scheme's exact value on the channel),
  ustar_exact_<k> (the oracle's exact value), violation_<k> (exact obedience
  violation of the committed scheme, 0 = obedient), n_support_<k>, n_schemes_<k>, parse_failures_<k>
  curves val_utility_<k> (committed mixture's sender utility on validation dialogues per PSRO
  iteration: the convergence curve) and meta_value_<k>
and per game lp_<g> (the persuasion LP), concav_<g>, truthful_<g>, babbling_<g> (exact values for
an exact Bayesian receiver).
Agents: the sender goes through reprozoo.blocks.llm_backend.backend_from_env, so setting
REPROZOO_LLM_BASE_URL (+ _MODEL, _API_KEY) replaces the offline sender by an OpenAI-compatible
model; config ``receiver: llm`` sends the receiver's prompts there too (every channel then is that
model, whose misreading is its own).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...blocks.llm_backend import ENV_URL, backend_from_env
from .games import GAMES
from .psro import draw_dialogues, play_dialogues, run_psro
from .solvers import (babbling_scheme, channel_oracle, channel_value, concavify_binary, lp_optimum,
                      max_violation, realized_sender_utility, truthful_scheme)
from .verbal import NoisyReader, TemplateSender, verbalize_scheme
from reprozoo.figures import save_figure

PAYOFF = {"vbp_psro": "dialogue", "vbp_exact_model": "model"}
GENERIC_CURVES: list[str] = []  # plot() draws the PSRO curves with the reference lines
FIXED = {"truthful": truthful_scheme, "babbling": babbling_scheme}
# common-random-number streams (offsets of ctx.rng): the same for every variant of a seed
TRAIN, VAL, TEST, PROPOSALS = 100, 200, 300, 1000


def sender_agent(p: dict):
    """The sender backend: the offline TemplateSender unless the environment names a model."""
    import os

    if p.get("require_llm") and not os.environ.get(ENV_URL):
        raise RuntimeError(f"this scale asks for a language model: set ${ENV_URL}, REPROZOO_LLM_MODEL "
                           "(and REPROZOO_LLM_API_KEY) to an OpenAI-compatible endpoint, or run scale smoke")
    return backend_from_env(TemplateSender(p_fresh=float(p["p_fresh"])), timeout_s=float(p.get("timeout_s", 60)))


def receiver_agent(p: dict, noise: float):
    """The receiver of one channel: the offline noisy reader, or the configured model (``receiver: llm``)."""
    if p.get("receiver", "reader") == "llm":
        return backend_from_env(NoisyReader(noise), timeout_s=float(p.get("timeout_s", 60)))
    return NoisyReader(noise)


def train(ctx) -> None:
    p, m = ctx.params, ctx.metrics
    sender = sender_agent(p)
    m.scalar("llm_backend", float(not isinstance(sender, TemplateSender)))
    grid = float(p["grid"])
    for gi, name in enumerate(p["games"]):
        game = GAMES[name]
        lp, _ = lp_optimum(game)
        m.scalar(f"lp_{name}", lp)
        m.scalar(f"concav_{name}", concavify_binary(game))
        m.scalar(f"truthful_{name}", realized_sender_utility(game, truthful_scheme(game)))
        m.scalar(f"babbling_{name}", realized_sender_utility(game, babbling_scheme(game)))
        train_d = draw_dialogues(game, int(p["n_train"]), ctx.rng(TRAIN + gi))
        val_d = draw_dialogues(game, int(p["n_val"]), ctx.rng(VAL + gi))
        test_d = draw_dialogues(game, int(p["n_test"]), ctx.rng(TEST + gi))
        for ci, (channel, noise) in enumerate(p["channels"].items()):
            key, noise = f"{name}_{channel}", float(noise)
            receiver = receiver_agent(p, noise)
            rng = ctx.rng(PROPOSALS + 10 * gi + ci)
            if ctx.variant in PAYOFF:
                out = run_psro(game, p, rng, sender, float(p["lam"]), receiver=receiver, train=train_d,
                               val=val_d, payoff=PAYOFF[ctx.variant], progress=ctx.progress)
                commitment, pi = out["commitment"], out["pi"]
                its = list(range(len(out["curve"])))
                m.curve(f"val_utility_{key}", its, out["curve"])
                m.curve(f"meta_value_{key}", its, out["meta_values"])
                m.scalar(f"parse_failures_{key}", out["parse_failures"])
                m.scalar(f"n_schemes_{key}", out["n_schemes"])
                m.scalar(f"n_support_{key}", out["n_support"])
            else:
                pi = FIXED[ctx.variant](game)
                commitment = verbalize_scheme(game, pi, rng)
            m.scalar(f"violation_{key}", max_violation(game, pi))
            m.scalar(f"u_channel_exact_{key}", channel_value(game, pi, noise)[0])
            star, star_pi = channel_oracle(game, noise, grid)
            m.scalar(f"ustar_exact_{key}", star)
            d = play_dialogues(game, commitment, test_d, receiver)
            oracle = play_dialogues(game, verbalize_scheme(game, star_pi, ctx.rng(TEST + 50 + gi)), test_d, receiver)
            m.units(f"u_{key}", d["u_s"])
            m.units(f"ustar_{key}", oracle["u_s"])
            m.units(f"obedience_rate_{key}", d["obey"])
            m.scalar(f"receiver_utility_{key}", d["receiver_utility"])
            (ctx.outdir / f"commitment_{key}.txt").write_text(commitment + "\n")
            ctx.progress(f"{key} (noise {noise:g}): dialogues U_s {d['sender_utility']:.4f} (oracle "
                         f"{oracle['sender_utility']:.4f}, LP {lp:.4f}), obedience {d['obedience_rate']:.4f}")


def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import plt

    pyplot = plt()
    games, channels = list(params["games"]), dict(params["channels"])
    scal = table[table.x.isna() & ~table.metric.str.endswith("#unit")]
    colors = {"vbp_psro": "C0", "vbp_exact_model": "C3", "truthful": "C2", "babbling": "C4"}

    # 1. sender utility against the receiver's noise: variants, the oracle and the exact BP optimum
    fig, axes = pyplot.subplots(1, len(games), figsize=(5 * len(games), 4), squeeze=False)
    noise = np.array([float(v) for v in channels.values()])
    for ax, name in zip(axes[0], games):
        for variant, color in colors.items():
            means, lo, hi = [], [], []
            for ch in channels:
                vals = scal[(scal.variant == variant) & (scal.metric == f"u_{name}_{ch}")].value
                means.append(vals.mean() if len(vals) else np.nan)
                lo.append(vals.min() if len(vals) else np.nan)
                hi.append(vals.max() if len(vals) else np.nan)
            if np.all(np.isnan(means)):
                continue
            ax.plot(noise, means, "o-", color=color, label=f"{variant} (mean, bars = min-max over seeds)")
            ax.fill_between(noise, lo, hi, color=color, alpha=0.15)
        star = [scal[(scal.metric == f"ustar_exact_{name}_{ch}")].value.mean() for ch in channels]
        ax.plot(noise, star, "k--", lw=1.2, label="oracle: best obedient grid scheme vs this receiver (exact)")
        lp = scal[scal.metric == f"lp_{name}"].value
        if len(lp):
            ax.axhline(float(lp.mean()), color="k", lw=1.0, label="exact BP optimum (LP)")
        ax.set_xlabel("receiver's misreading noise (s.d. of its log-odds error)")
        ax.set_ylabel("sender utility in test dialogues")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"{name}: does the verbal loop track the receiver it faces?", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6, loc="upper right")
    save_figure(fig, plots_dir / "utility_vs_noise.png", dpi=110)

    # 2. PSRO curves (validation dialogues) per game and channel
    curves = table[table.x.notna()]
    if curves.empty:
        return
    fig, axes = pyplot.subplots(len(channels), len(games), figsize=(5 * len(games), 3.2 * len(channels)),
                                squeeze=False)
    for r, ch in enumerate(channels):
        for c, name in enumerate(games):
            ax = axes[r][c]
            sub = curves[curves.metric == f"val_utility_{name}_{ch}"]
            for variant in ("vbp_psro", "vbp_exact_model"):
                g = sub[sub.variant == variant].groupby("x").value
                if g.ngroups == 0:
                    continue
                mean = g.mean()
                ax.plot(mean.index, mean.values, color=colors[variant], label=variant)
                ax.fill_between(mean.index, g.min().values, g.max().values, color=colors[variant], alpha=0.2)
            star = scal[scal.metric == f"ustar_exact_{name}_{ch}"].value
            if len(star):
                ax.axhline(float(star.mean()), color="k", ls="--", lw=1.0, label="oracle (exact)")
            ax.set_title(f"{name}, {ch} noise ({channels[ch]})", fontsize=8)
            ax.set_xlabel("PSRO iteration")
            ax.set_ylabel("validation sender utility")
            ax.set_ylim(-0.05, 1.05)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6)
    save_figure(fig, plots_dir / "psro_curves.png", dpi=100)
