"""Rex in miniature: exact-score Gaussian mixture plus a denoiser trained by the pipeline.

train_shared (per seed): train the denoiser network; draw the test data and the noise batch;
solve the probability-flow ODE to tight tolerance (DOP853) for the reference samples.
train (per variant x seed): round-trip error data->noise->data over step counts (exact score and
learned denoiser, float64), sampling error vs step count and its log-log slope (empirical order),
linear stability interval, evaluations and wall time per step, sample quality.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ...data.synthetic.gmm import GaussianMixture
from ...io import save_npz
from .samplers import make_sampler, ode_order, rho_grid

# --- denoiser network ------------------------------------------------------------------------


def _net(width: int, depth: int):
    import torch

    layers, d_in = [], 3
    for _ in range(depth):
        layers += [torch.nn.Linear(d_in, width), torch.nn.SiLU()]
        d_in = width
    layers.append(torch.nn.Linear(d_in, 2))
    return torch.nn.Sequential(*layers)


class Denoiser:
    """EDM-preconditioned denoiser D(y, rho) = c_skip*y + c_out*F([c_in*y, log(rho)/4]).

    The skip connection makes D close to the identity at low noise, which keeps the learned
    dynamics as well conditioned as the exact ones there. Called as D(y, rho) on numpy arrays,
    in float64 for the round trips.
    """

    SIGMA_DATA = 2.0

    def __init__(self, net):
        self.net = net

    def denoise(self, y, rho):
        import torch

        sd2 = self.SIGMA_DATA**2
        c_in = 1.0 / torch.sqrt(sd2 + rho**2)
        c_skip = sd2 / (sd2 + rho**2)
        c_out = rho * self.SIGMA_DATA * c_in
        return c_skip * y + c_out * self.net(torch.cat([y * c_in, torch.log(rho) / 4.0], dim=-1))

    def __call__(self, y: np.ndarray, rho: float) -> np.ndarray:
        import torch

        with torch.no_grad():
            yt = torch.from_numpy(np.ascontiguousarray(y))
            r = torch.full((len(yt), 1), float(rho), dtype=torch.float64)
            return self.denoise(yt, r).numpy()


def train_denoiser(x: np.ndarray, cfg: dict, rho_min: float, rho_max: float, seed: int, progress=print):
    """Denoising score matching with EDM's loss weight (1/c_out^2), rho log-uniform."""
    import torch

    torch.manual_seed(seed)
    net = _net(cfg["width"], cfg["depth"])
    den = Denoiser(net)
    opt = torch.optim.Adam(net.parameters(), lr=cfg["lr"])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg["steps"])
    data = torch.from_numpy(x).float()
    gen = torch.Generator().manual_seed(seed)
    sd = Denoiser.SIGMA_DATA
    losses = []
    for step in range(cfg["steps"]):
        idx = torch.randint(len(data), (cfg["batch"],), generator=gen)
        x0 = data[idx]
        logr = torch.rand(cfg["batch"], 1, generator=gen) * (np.log(rho_max) - np.log(rho_min)) + np.log(rho_min)
        rho = torch.exp(logr)
        y = x0 + rho * torch.randn(x0.shape, generator=gen)
        weight = (sd**2 + rho**2) / (rho * sd) ** 2
        loss = (weight * (den.denoise(y, rho) - x0) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % max(1, cfg["steps"] // 5) == 0:
            progress(f"denoiser step {step}/{cfg['steps']} loss {loss.item():.4f}")
    net.double().eval()
    return den, losses


def load_denoiser(shared_dir: Path, cfg: dict) -> Denoiser:
    import torch

    net = _net(cfg["width"], cfg["depth"])
    net.load_state_dict(torch.load(shared_dir / "denoiser.pt", weights_only=True))
    return Denoiser(net.double().eval())


# --- shared per-seed work ----------------------------------------------------------------------

def reference_solution(eps, noise: np.ndarray, rho_max: float, rho_min: float) -> np.ndarray:
    """Probability-flow ODE solved to rtol 1e-12 in s = log(rho): dy/ds = rho * eps(y, rho)."""
    from scipy.integrate import solve_ivp

    shape = noise.shape

    def rhs(s, y):
        rho = np.exp(s)
        return rho * eps(y.reshape(shape), rho).ravel()

    sol = solve_ivp(rhs, (np.log(rho_max), np.log(rho_min)), noise.ravel(), method="DOP853",
                    rtol=1e-12, atol=1e-12)
    if not sol.success:
        raise RuntimeError(f"reference ODE solve failed: {sol.message}")
    return sol.y[:, -1].reshape(shape)


def train_shared(ctx) -> None:
    p = ctx.params
    if p.get("backend", "gmm") != "gmm":
        from .diffusers_backend import train_shared_diffusers

        return train_shared_diffusers(ctx)
    gmm = GaussianMixture.load(ctx.data["gmm2d"] / "gmm_params.npz")
    x = np.load(ctx.data["gmm2d"] / "samples.npz")["x"]
    t0 = time.perf_counter()
    den, losses = train_denoiser(x, p["denoiser"], p["rho_min"], p["rho_max"], ctx.seed, ctx.progress)
    ctx.metrics.scalar("denoiser_train_seconds", time.perf_counter() - t0)
    ctx.metrics.scalar("denoiser_final_loss", float(np.mean(losses[-50:])))
    ctx.metrics.curve("denoiser_loss", range(0, len(losses), 10), losses[::10])
    import torch

    torch.save(den.net.state_dict(), ctx.outdir / "denoiser.pt")
    rng = ctx.rng(1)
    x_test = gmm.sample(p["n_test"], rng)
    noise = p["rho_max"] * rng.standard_normal((p["n_conv"], 2))
    ctx.progress("solving the reference ODE (DOP853, rtol 1e-12)")
    y_ref = reference_solution(gmm.eps, noise, p["rho_max"], p["rho_min"])
    save_npz(ctx.outdir / "batches.npz", x_test=x_test, noise=noise, y_ref=y_ref)


# --- per variant -------------------------------------------------------------------------------

class Counter:
    def __init__(self, fn):
        self.fn, self.n = fn, 0

    def __call__(self, y, rho):
        self.n += 1
        return self.fn(y, rho)


def roundtrip_error(variant: str, denoise, x0: np.ndarray, rhos: np.ndarray, params: dict, rng) -> float:
    """max |x_rec - x| after data -> noise -> data.

    ODE samplers start from the data x0. The stochastic sampler replays a recorded trajectory:
    x is sampled from noise with Brownian increments W, inverted from its final state with the same
    W, and decoded again (a point that did not come from W has no well-conditioned latent).
    """
    s = make_sampler(variant, denoise, params)
    if s.stochastic:
        dws = s.brownian(rhos, x0.shape, rng)
        state = s.decode(s.init(params["rho_max"] * rng.standard_normal(x0.shape)), rhos, dws)
        x_ref = s.output(state)
        latent = s.encode_state(state, rhos, dws)
    else:
        dws, x_ref = None, x0
        latent = s.encode(x0, rhos)
    x_rec = s.output(s.decode(latent, rhos, dws))
    err = np.max(np.abs(x_rec - x_ref))
    return float(err) if np.isfinite(err) else float("inf")


def empirical_order(steps, errors, floor: float, n_fit: int = 3) -> float:
    """-slope of log(error) against log(steps) over the ``n_fit`` finest step counts above the
    round-off floor: the asymptotic regime, where an order is defined (NaN if too few points)."""
    steps, errors = np.asarray(steps, float), np.asarray(errors, float)
    keep = np.flatnonzero(np.isfinite(errors) & (errors > floor))
    if len(keep) < n_fit:
        return float("nan")
    keep = keep[-n_fit:]
    slope = np.polyfit(np.log(steps[keep]), np.log(errors[keep]), 1)[0]
    return float(-slope)


def train(ctx) -> None:
    p = ctx.params
    if p.get("backend", "gmm") != "gmm":
        from .diffusers_backend import train_diffusers

        return train_diffusers(ctx)
    v = ctx.variant
    gmm = GaussianMixture.load(ctx.data["gmm2d"] / "gmm_params.npz")
    batches = np.load(ctx.shared_dir / "batches.npz")
    x_test, noise, y_ref = batches["x_test"], batches["noise"], batches["y_ref"]
    den = load_denoiser(ctx.shared_dir, p["denoiser"])

    rt, rt_learned = [], []
    for n in p["steps_roundtrip"]:
        rhos = rho_grid(p["rho_max"], p["rho_min"], n)
        rt.append(roundtrip_error(v, gmm.denoise, x_test, rhos, p, ctx.rng(10 + n)))
        rt_learned.append(roundtrip_error(v, den, x_test, rhos, p, ctx.rng(10 + n)))
        ctx.progress(f"N={n}: round trip {rt[-1]:.3e} (exact score), {rt_learned[-1]:.3e} (learned)")
    ctx.metrics.curve("roundtrip_err", p["steps_roundtrip"], rt)
    ctx.metrics.curve("roundtrip_err_learned", p["steps_roundtrip"], rt_learned)
    ctx.metrics.scalar("roundtrip_err_max", max(rt))

    sampler = make_sampler(v, gmm.denoise, p)
    errs, nll_gaps = [], []
    true_nll = -gmm.log_prob(gmm.sample(20000, ctx.rng(2)), p["rho_min"]).mean()
    for n in p["steps_conv"]:
        rhos = rho_grid(p["rho_max"], p["rho_min"], n)
        dws = sampler.brownian(rhos, noise.shape, ctx.rng(20 + n)) if sampler.stochastic else None
        y = sampler.output(sampler.decode(sampler.init(noise), rhos, dws))
        errs.append(float(np.mean(np.linalg.norm(y - y_ref, axis=1))))
        nll_gaps.append(float(-gmm.log_prob(y, p["rho_min"]).mean() - true_nll))
    ctx.metrics.curve("nll_gap", p["steps_conv"], nll_gaps)
    if not sampler.stochastic:
        ctx.metrics.curve("sample_err", p["steps_conv"], errs)
        ctx.metrics.scalar("order", empirical_order(p["steps_conv"], errs, p["error_floor"]))
        if ode_order(v):
            ctx.metrics.scalar("expected_order", ode_order(v))
        ctx.progress(f"sampling errors {['%.2e' % e for e in errs]}")

    from ...blocks.ode import stability_interval

    ctx.metrics.scalar("stability_interval",
                       stability_interval(lambda vec, z: sampler.linear_step(vec, z), sampler.state_dim))

    counted = Counter(gmm.denoise)
    timed = make_sampler(v, counted, p)
    n = max(p["steps_roundtrip"])
    rhos = rho_grid(p["rho_max"], p["rho_min"], n)
    dws = timed.brownian(rhos, x_test.shape, ctx.rng(3)) if timed.stochastic else None
    t0 = time.perf_counter()
    timed.decode(timed.init(x_test * p["rho_max"]), rhos, dws)
    ctx.metrics.scalar("ms_per_step", 1e3 * (time.perf_counter() - t0) / n)
    ctx.metrics.scalar("nfe_per_step", counted.n / n)


# --- plots ---------------------------------------------------------------------------------------

def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot, plt

    curve_plot(table, "roundtrip_err", plots_dir / "curve_roundtrip_err.png", logx=True, logy=True,
               xlabel="steps N", ylabel="max |x_rec - x| (float64)",
               title="Round trip data->noise->data, exact score")
    curve_plot(table, "roundtrip_err_learned", plots_dir / "curve_roundtrip_err_learned.png", logx=True, logy=True,
               xlabel="steps N", ylabel="max |x_rec - x| (float64)", title="Round trip, learned denoiser")
    p = plt()
    fig, ax = p.subplots(figsize=(5.5, 4))
    sub = table[table.metric == "sample_err"]
    for v in sorted(sub.variant.unique()):
        g = sub[sub.variant == v].groupby("x").value.mean()
        ax.loglog(g.index, g.values, marker="o", ms=3, label=v)
    if not sub.empty:
        xs = np.array(sorted(sub.x.unique()))
        y0 = sub.value.max()
        for order in (1, 2, 4):
            ax.loglog(xs, y0 * (xs / xs[0]) ** (-order), "k:", lw=0.8)
            ax.annotate(f"order {order}", (xs[-1], y0 * (xs[-1] / xs[0]) ** (-order)), fontsize=7)
    ax.set_xlabel("steps N")
    ax.set_ylabel("mean |y_N - y_ref|")
    ax.set_title("Convergence of sampling (probability-flow ODE)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(plots_dir / "curve_sample_err.png", dpi=110)
    p.close(fig)
