"""Rex in miniature: a Gaussian mixture whose exact denoiser is known in closed form.

train_shared (per seed): draw the test data and the noise batch; solve the probability-flow ODE
to tight tolerance (DOP853) for the reference samples.
train (per variant x seed): round-trip error over step counts (float64; both directions for the
SDE), sampling error vs step count and its log-log slope (empirical order), sampling error at equal
denoiser evaluations, linear stability interval, evaluations and wall time per step, sample quality
(kernel MMD against a permutation null, with a dose response of planted errors).
The denoiser network below is not trained by the pipeline (no claim reads one); the tests train it
to show that the round trip is exact with a learned network as with an untrained one.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ...data.synthetic.gmm import GaussianMixture
from ...io import save_npz
from .samplers import make_sampler, ode_order, rho_grid
from reprozoo.figures import save_figure

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


def _dsm_weight(rho):
    sd = Denoiser.SIGMA_DATA
    return (sd**2 + rho**2) / (rho * sd) ** 2  # EDM's 1/c_out^2: unit loss for the trivial denoiser


def validation_set(gmm, n: int, rho_min: float, rho_max: float, seed: int):
    """A fixed held-out denoising problem: fresh mixture samples (never in the training file), noise
    levels on a log grid over [rho_min, rho_max] (shuffled), fixed noise."""
    import torch

    rng = np.random.default_rng(seed)
    x0 = torch.from_numpy(gmm.sample(n, rng)).float()
    rho = torch.from_numpy(np.exp(rng.permutation(np.linspace(np.log(rho_min), np.log(rho_max), n)))).float()[:, None]
    y = x0 + rho * torch.from_numpy(rng.standard_normal((n, 2))).float()
    return x0, y, rho


def train_denoiser(x: np.ndarray, cfg: dict, rho_min: float, rho_max: float, seed: int, progress=print,
                   val=None):
    """Denoising score matching with EDM's loss weight (1/c_out^2), rho log-uniform. Cosine schedule
    from lr down to lr_floor x lr (never to zero, so the convergence gate can read a plateau), the
    held-out loss on ``val`` (x0, y, rho) every steps / val_points steps (and at the end)."""
    import torch

    torch.manual_seed(seed)
    net = _net(cfg["width"], cfg["depth"])
    den = Denoiser(net)
    opt = torch.optim.Adam(net.parameters(), lr=cfg["lr"])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg["steps"], eta_min=cfg.get("lr_floor", 0.2) * cfg["lr"])
    data = torch.from_numpy(x).float()
    gen = torch.Generator().manual_seed(seed)
    every = max(1, cfg["steps"] // cfg.get("val_points", 20))
    hist = {"steps": [], "train_loss": [], "val_steps": [], "val_loss": [], "lr": []}

    def validate(step):
        if val is None:
            return
        with torch.no_grad():
            x0v, yv, rv = val
            hist["val_steps"].append(step)
            hist["val_loss"].append(float((_dsm_weight(rv) * (den.denoise(yv, rv) - x0v) ** 2).mean()))
            hist["lr"].append(float(opt.param_groups[0]["lr"]))

    for step in range(cfg["steps"]):
        if step % every == 0:
            validate(step)
        idx = torch.randint(len(data), (cfg["batch"],), generator=gen)
        x0 = data[idx]
        logr = torch.rand(cfg["batch"], 1, generator=gen) * (np.log(rho_max) - np.log(rho_min)) + np.log(rho_min)
        rho = torch.exp(logr)
        y = x0 + rho * torch.randn(x0.shape, generator=gen)
        loss = (_dsm_weight(rho) * (den.denoise(y, rho) - x0) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        hist["steps"].append(step)
        hist["train_loss"].append(loss.item())
        if step % max(1, cfg["steps"] // 5) == 0:
            progress(f"denoiser step {step}/{cfg['steps']} loss {loss.item():.4f}"
                     + (f", held-out {hist['val_loss'][-1]:.4f}" if hist["val_loss"] else ""))
    validate(cfg["steps"])
    net.double().eval()
    return den, hist


def untrained_denoiser(cfg: dict, seed: int) -> Denoiser:
    """The same architecture at its initialisation (the round-trip claim's foil: exactness is
    algebraic, so it does not need a trained network)."""
    import torch

    torch.manual_seed(10_000 + seed)
    return Denoiser(_net(cfg["width"], cfg["depth"]).double().eval())


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
    # No network is trained here any more: no claim reads one (the round trip's exactness is
    # algebraic, and tests/test_rex.py checks it with a trained and an untrained network), so the
    # pipeline spends nothing on a fit whose convergence would decide nothing. The denoiser code
    # above stays for those tests and for the paper backend's pretrained network.
    gmm = GaussianMixture.load(ctx.data["gmm2d"] / "gmm_params.npz")
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


def roundtrip_error(variant: str, denoise, x0: np.ndarray, rhos: np.ndarray, params: dict, rng,
                    from_data: bool = False, per_point: bool = False):
    """max |x_rec - x| after a round trip (``per_point``: the array of max-norm errors per point).

    ODE samplers: data -> noise -> data from the data x0. The stochastic sampler (default): a
    recorded trajectory is replayed: x is sampled from noise with Brownian increments W, inverted
    from its final solver state with the same W, and decoded again (noise -> data -> noise ->
    data). ``from_data``: the stochastic sampler instead starts from the data x0 itself (state
    (x0, x0)) with freshly drawn, stored increments W: data -> noise -> data, as for the ODEs.
    """
    s = make_sampler(variant, denoise, params)
    if s.stochastic:
        dws = s.brownian(rhos, x0.shape, rng)
        if from_data:
            x_ref = x0
            latent = s.encode(x0, rhos, dws)
        else:
            state = s.decode(s.init(params["rho_max"] * rng.standard_normal(x0.shape)), rhos, dws)
            x_ref = s.output(state)
            latent = s.encode_state(state, rhos, dws)
    else:
        dws, x_ref = None, x0
        latent = s.encode(x0, rhos)
    x_rec = s.output(s.decode(latent, rhos, dws))
    errs = np.max(np.abs(x_rec - x_ref), axis=1)
    errs = np.where(np.isfinite(errs), errs, np.inf)
    return errs if per_point else float(np.max(errs))


def _finite(values, cap: float = 1.0e300) -> list[float]:
    """Round-trip errors for the record: an inversion that overflowed (BDIA at gamma < 1 divides by
    gamma every step) is recorded at ``cap`` rather than as inf/NaN."""
    return [float(min(x, cap)) if np.isfinite(x) else cap for x in np.asarray(values, dtype=float)]


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


def order_drift(steps, errors, floor: float, n_fit: int = 3) -> float:
    """How far the fit window of :func:`empirical_order` is from the asymptotic range: the spread
    (max - min) of the local slopes between consecutive step counts in that window. In the
    asymptotic range the local slope no longer changes with h; a window still in the pre-asymptotic
    range (or on a plateau) shows it drifting (NaN if too few points)."""
    steps, errors = np.asarray(steps, float), np.asarray(errors, float)
    keep = np.flatnonzero(np.isfinite(errors) & (errors > floor))
    if len(keep) < n_fit:
        return float("nan")
    keep = keep[-n_fit:]
    local = -np.diff(np.log(errors[keep])) / np.diff(np.log(steps[keep]))
    return float(np.max(local) - np.min(local))


def sampling_errors(sampler, noise, y_ref, params, steps_conv=None, per_noise: dict | None = None):
    """Mean |y_N - y_ref| over steps_conv (ODE samplers). Stops refining once the error is within
    10x of the floor (the reference's own accuracy): the next halving would fall below it.
    ``per_noise``: if given, filled with {N: the per-noise errors |y_N - y_ref|}."""
    steps, errs = [], []
    for n in steps_conv or params["steps_conv"]:
        y = sampler.output(sampler.decode(sampler.init(noise), rho_grid(params["rho_max"], params["rho_min"], n)))
        e = np.linalg.norm(y - y_ref, axis=1)
        if per_noise is not None:
            per_noise[n] = e
        steps.append(n)
        errs.append(float(np.mean(e)))
        if not errs[-1] > 10 * params["error_floor"]:
            break
    return steps, errs


def steps_for_budget(variant: str, budget: int, cost: tuple[int, int]) -> int:
    """Steps N that spend exactly ``budget`` denoiser evaluations, a*N + b = budget."""
    per_step, start = cost
    n, rest = divmod(budget - start, per_step)
    if rest or n < 1:
        raise ValueError(f"nfe budget {budget} is not a multiple of {variant}'s {per_step} evaluations "
                         f"per step (plus {start} to start)")
    return n


def nfe_cost(variant: str, denoise, params: dict, probe: np.ndarray) -> tuple[int, int]:
    """Denoiser evaluations of an ODE sampler's solve of N steps, a*N + b, counted on probe solves
    of 4 and 8 steps: (a, b) = (evaluations per step, evaluations to start a solve). Reversible
    Heun reuses f(z_{n+1}) in the next step (a = 1, b = 1); Rex evaluates its base increment twice
    per step (a = 2 x stages, b = 0); BDIA and DDIM a = 1, b = 0."""
    counts = []
    for n in (4, 8):
        counted = Counter(denoise)
        s = make_sampler(variant, counted, params)
        s.decode(s.init(probe), rho_grid(params["rho_max"], params["rho_min"], n))
        counts.append(counted.n)
    per_step, rest = divmod(counts[1] - counts[0], 4)
    if rest or counts[0] - 4 * per_step < 0:
        raise RuntimeError(f"{variant}: {counts} evaluations over 4 and 8 steps is not a*N + b")
    return per_step, counts[0] - 4 * per_step


def nfe_per_step(variant: str, denoise, params: dict, probe: np.ndarray) -> int:
    """Denoiser evaluations per step of an ODE sampler (see :func:`nfe_cost`)."""
    return nfe_cost(variant, denoise, params, probe)[0]


def sampling_errors_at_nfe(variant: str, denoise, noise, y_ref, params, known: dict | None = None,
                           per_budget: dict | None = None) -> tuple[list, list]:
    """Mean |y - y_ref| at equal cost: for each budget in ``nfe_budgets`` (denoiser evaluations per
    sample along the whole solve, start-up evaluations included), the sampler takes the steps that
    spend exactly that budget, at the paper's zeta. The cost that matters with a real network is
    the evaluations, so two samplers are compared at the same count, in the same run, from the
    same noise. ``known``: per-noise errors {steps: array} of the same sampler on the same noise
    at the paper's zeta, solved already (the step sweeps), which are reused rather than solved
    again. ``per_budget``: if given, filled with {budget: per-noise errors}."""
    known = known if known is not None else {}
    cost = nfe_cost(variant, denoise, params, noise[:1])
    s = make_sampler(variant, denoise, params)
    nfes, errs = [], []
    for budget in params["nfe_budgets"]:
        n = steps_for_budget(variant, budget, cost)
        if n not in known:
            y = s.output(s.decode(s.init(noise), rho_grid(params["rho_max"], params["rho_min"], n)))
            known[n] = np.linalg.norm(y - y_ref, axis=1)
        if per_budget is not None:
            per_budget[budget] = known[n]
        nfes.append(budget)
        errs.append(float(np.mean(known[n])))
    return nfes, errs


def asymptotic_range(budgets, errors, floor: float, tol: float = 0.1, min_slopes: int = 2):
    """The asymptotic range of an error curve by a rule fixed before measuring (spec, README): of
    the budgets whose error is above 10x the floor (the reference's own accuracy), the first from
    which every local slope (between consecutive budgets) agrees within ``tol`` (max - min), with at
    least ``min_slopes`` local slopes. Returns (indices of the range, spread of its local slopes).
    If no budget qualifies, the last min_slopes + 1 budgets and the spread of every local slope of
    the curve (> tol, and far from it where the curve is pre-asymptotic or on a plateau): a claim's
    precondition on the spread then makes it untestable rather than read a pre-asymptotic range."""
    b, e = np.asarray(budgets, float), np.asarray(errors, float)
    keep = []
    for k in range(len(e)):
        if not (np.isfinite(e[k]) and e[k] > 10 * floor):
            break
        keep.append(k)
    keep = np.asarray(keep, dtype=int)
    if len(keep) < min_slopes + 1:
        return keep, float("nan")
    local = -np.diff(np.log(e[keep])) / np.diff(np.log(b[keep]))
    for j in range(len(local) - min_slopes + 1):
        spread = float(np.max(local[j:]) - np.min(local[j:]))
        if spread <= tol:
            return keep[j:], spread
    return keep[-(min_slopes + 1):], float(np.max(local) - np.min(local))


def roundtrip_at_nfe(variant: str, denoise, x0, params) -> tuple[list, list]:
    """The round-trip error data -> noise -> data at each budget's own step count N (the N the
    equal-cost comparison samples with), so that "inverts exactly" is read where it is used."""
    cost = nfe_cost(variant, denoise, params, x0[:1])
    errs = [roundtrip_error(variant, denoise, x0, rho_grid(params["rho_max"], params["rho_min"],
                                                           steps_for_budget(variant, b, cost)), params, None)
            for b in params["nfe_budgets"]]
    return list(params["nfe_budgets"]), errs


def denoiser_float32(gmm):
    """The mixture's closed-form denoiser evaluated in float32 (parameters, posterior and output),
    a stand-in for a float32 network: D(y, rho) = y + rho^2 * score, as ``GaussianMixture.denoise``."""
    f32 = np.float32
    means, covs = gmm.means.astype(f32), gmm.covs.astype(f32)
    logw = np.log(gmm.weights).astype(f32)
    d = means.shape[1]

    def denoise(y, rho):
        y, rho = np.asarray(y, dtype=f32), f32(rho)
        cov = covs + (rho * rho) * np.eye(d, dtype=f32)
        prec = np.linalg.inv(cov)
        diff = y[:, None, :] - means[None]
        maha = np.einsum("nki,kij,nkj->nk", diff, prec, diff)
        logdet = np.linalg.slogdet(cov)[1].astype(f32)
        lw = logw[None] - f32(0.5) * (maha + logdet[None])
        resp = np.exp(lw - lw.max(axis=1, keepdims=True))
        resp /= resp.sum(axis=1, keepdims=True)
        score = -np.einsum("nk,kij,nkj->ni", resp, prec, diff)
        return y + (rho * rho) * score

    return denoise


def recon_float32(variant: str, denoise32, x0: np.ndarray, n: int, params: dict) -> np.ndarray:
    """The paper's reconstruction test in finite precision (its image scripts run float32): the
    data points x0 (rounded to float32) go data -> noise -> data over n steps with float32 states,
    a float32 grid and ``denoise32``, a denoiser that returns float32 (:func:`denoiser_float32`:
    the closed form evaluated in float32). Returns the per-point mean squared reconstruction error
    over the point's coordinates (reconstruction.py's metric, per unit)."""
    s = make_sampler(variant, denoise32, params)
    rhos = rho_grid(params["rho_max"], params["rho_min"], n).astype(np.float32)
    x = np.asarray(x0, dtype=np.float32)
    rec = s.output(s.decode(s.encode(x, rhos), rhos))
    if rec.dtype != np.float32:
        raise RuntimeError(f"{variant}: the float32 round trip left float32 ({rec.dtype})")
    err = np.mean((rec.astype(float) - x.astype(float)) ** 2, axis=1)
    return np.where(np.isfinite(err), err, 1.0e300)


def coupling_plateau(ctx, gmm, noise, y_ref, params) -> None:
    """Rex-Euler's coupling bias at N = plateau_steps, for each zeta in plateau_zetas.

    The bias is the mean distance between the coupled solution at zeta and at zeta = 1 (the
    symmetric pair, second order here) from the same noise on the same grid: the part of the
    sampling error the coupling adds. Where h*a >> 1 - zeta a linear analysis predicts it
    independent of h and proportional to 1 - zeta; ``plateau_slope`` is the log-log slope of the
    bias against 1 - zeta (1 if proportional).
    """
    n = params["plateau_steps"]
    rhos = rho_grid(params["rho_max"], params["rho_min"], n)

    def run(zeta):
        s = make_sampler("rex_euler", gmm.denoise, {**params, "zeta": zeta})
        return s.output(s.decode(s.init(noise), rhos))

    y1 = run(1.0)
    zetas = np.asarray(params["plateau_zetas"], dtype=float)
    ys = [run(z) for z in zetas]
    bias = [float(np.mean(np.linalg.norm(y - y1, axis=1))) for y in ys]
    err = [float(np.mean(np.linalg.norm(y - y_ref, axis=1))) for y in ys]
    gap = 1.0 - zetas
    ctx.metrics.curve("plateau_bias", gap, bias)
    ctx.metrics.curve("plateau_err", gap, err)
    ctx.metrics.scalar("plateau_err_zeta1", float(np.mean(np.linalg.norm(y1 - y_ref, axis=1))))
    ctx.metrics.scalar("plateau_slope", float(np.polyfit(np.log(gap), np.log(bias), 1)[0]))
    ctx.progress(f"coupling bias at N={n}: {['%.2e' % b for b in bias]} for 1-zeta {list(gap)}")


def sliced_w2(x: np.ndarray, y: np.ndarray, proj: np.ndarray) -> float:
    """Sliced 2-Wasserstein distance between two equal-size point clouds: on each direction the
    1-D optimal coupling pairs sorted projections, so SW2^2 = mean over directions and ranks of the
    squared gaps (POT's sliced_wasserstein_distance computes the same through generic 1-D OT,
    about 100x slower at this size)."""
    if len(x) != len(y):
        raise ValueError("sliced_w2 pairs sorted projections: equal sample sizes needed")
    px, py = np.sort(x @ proj, axis=0), np.sort(y @ proj, axis=0)
    return float(np.sqrt(np.mean((px - py) ** 2)))


def sample_quality(sampler, gmm, params, rng, steps: int | None = None, dw_scale: float = 1.0):
    """Sliced 2-Wasserstein distance of n_sw samples (sw_steps steps, fresh noise) to n_sw exact
    mixture samples, against the same distance between two independent exact sets (what a perfect
    sampler scores at this sample size); each the mean over sw_batches independent batches, since
    one batch's distance scatters by ~30 % whatever n is. Also the NLL gap of the samples.
    The same projections, reference sets and noise for every variant (common random numbers),
    Brownian increments drawn last. ``dw_scale``: the Brownian increments multiplied by it (a
    planted error in the injected noise, for the sample-quality claim's control)."""
    n, steps = params["n_sw"], steps or params["sw_steps"]
    rhos = rho_grid(params["rho_max"], params["rho_min"], n=steps)
    angles = np.random.default_rng(12345).uniform(0.0, np.pi, params["sw_projections"])
    proj = np.stack([np.cos(angles), np.sin(angles)])  # (2, P) unit directions
    sws, floors, gaps = [], [], []
    for _ in range(params["sw_batches"]):
        ref, other = gmm.sample(n, rng), gmm.sample(n, rng)
        noise = params["rho_max"] * rng.standard_normal((n, 2))
        dws = [dw_scale * dw for dw in sampler.brownian(rhos, noise.shape, rng)] if sampler.stochastic else None
        x = sampler.output(sampler.decode(sampler.init(noise), rhos, dws))
        floors.append(sliced_w2(other, ref, proj))
        if not np.all(np.isfinite(x)):
            sws.append(np.inf)
            gaps.append(np.inf)
            continue
        sws.append(sliced_w2(x, ref, proj))
        gaps.append(-gmm.log_prob(x, params["rho_min"]).mean() + gmm.log_prob(other, params["rho_min"]).mean())
    return float(np.mean(sws)), float(np.mean(floors)), float(np.mean(gaps))


def mixture_scale(gmm) -> float:
    """The MMD kernel's bandwidth, from the mixture's own parameters (fixed before any measurement):
    the components' root-mean-square standard deviation per coordinate, the finest scale of the
    data, where a sampler that injects too little (or too much) noise shows first."""
    return float(np.sqrt(np.mean(np.trace(gmm.covs, axis1=1, axis2=2)) / gmm.means.shape[1]))


def _gram_sum(a: np.ndarray, b: np.ndarray | None, ell: float) -> float:
    """Sum of the Gaussian kernel exp(-|a_i - b_j|^2 / (2 ell^2)) over all pairs; ``b`` None: over
    the pairs i != j of ``a`` itself. In float32 (the kernel matrix is the cost; the sums' rounding,
    ~1e-7 relative, is 1e-4 of the null's spread at n = 2000), summed in float64."""
    same = b is None
    a = np.asarray(a, dtype=np.float32)
    b = a if same else np.asarray(b, dtype=np.float32)
    d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * (a @ b.T)
    k = np.exp(-np.maximum(d2, 0.0) / np.float32(2.0 * ell**2))
    return float(k.sum(dtype=np.float64) - (len(a) if same else 0.0))  # the diagonal is exp(0) = 1


def mmd2_unbiased(x: np.ndarray, y: np.ndarray, ell: float, self_y: float | None = None) -> float:
    """The unbiased estimate of MMD^2 between the laws of ``x`` and ``y`` (Gaussian kernel of
    bandwidth ``ell``; Gretton et al. 2012, eq. 3): zero in expectation when they are equal.
    ``self_y``: the off-diagonal kernel sum of ``y`` if already computed."""
    n, m = len(x), len(y)
    syy = _gram_sum(y, None, ell) if self_y is None else self_y
    return _gram_sum(x, None, ell) / (n * (n - 1)) + syy / (m * (m - 1)) - 2.0 * _gram_sum(x, y, ell) / (n * m)


def mmd_null(gmm, params, rng) -> np.ndarray:
    """The statistic's own null at this sample size, by permutation: two independent exact sets of
    mmd_n samples are pooled, and MMD^2_u is recomputed for mmd_null random equal splits of the pool
    (each a draw of the exact-vs-exact statistic; under the null the labels are exchangeable).

    Cheap: with the pool's kernel matrix K (2n x 2n, computed once) and a split's indicator a
    (b = 1 - a), the within- and between-set sums are quadratic forms, a'Ka, b'Kb = T - 2a'r + a'Ka
    and a'Kb = a'r - a'Ka (r = K1, T = 1'K1), so all splits cost one product K @ A."""
    n = params["mmd_n"]
    pool = np.concatenate([gmm.sample(n, rng), gmm.sample(n, rng)])
    splits = [rng.permutation(2 * n)[:n] for _ in range(params["mmd_null"])]
    return mmd2_splits(pool, splits, mixture_scale(gmm))


def mmd2_splits(pool: np.ndarray, splits, ell: float, chunk: int = 100) -> np.ndarray:
    """MMD^2_u between pool[idx] and the rest of the pool, for each index set idx in ``splits`` (all
    of size len(pool) / 2), from one kernel matrix (see :func:`mmd_null`)."""
    n = len(pool) // 2
    d2 = (pool * pool).sum(1)[:, None] + (pool * pool).sum(1)[None, :] - 2.0 * (pool @ pool.T)
    k = np.exp(-np.maximum(d2, 0.0) / (2.0 * ell**2))  # float64: the statistic is a small difference
    r = k.sum(1)
    total = float(r.sum())
    out = []
    for start in range(0, len(splits), chunk):  # memory: 2n x chunk
        part = splits[start:start + chunk]
        a = np.zeros((2 * n, len(part)))
        for j, idx in enumerate(part):
            a[idx, j] = 1.0
        aka = np.einsum("ij,ij->j", a, k @ a)
        ar = a.T @ r
        s_aa, s_bb, s_ab = aka - n, total - 2.0 * ar + aka - n, ar - aka  # diagonals (exp(0) = 1) out
        out.append((s_aa + s_bb) / (n * (n - 1)) - 2.0 * s_ab / n**2)
    return np.concatenate(out)


def mmd_test(sampler, gmm, params, rng, q95: float, dw_scales=(1.0,)) -> list[np.ndarray]:
    """Per batch (mmd_batches of them, the claim's units): MMD^2_u of mmd_n samples (sw_steps
    steps, fresh noise) to mmd_n fresh exact mixture samples, divided by ``q95``, the 95 % quantile
    of the exact-vs-exact null (:func:`mmd_null`, same run, same n). A ratio <= 1: the batch is
    within what two exact sets show 95 % of the time. One array per entry of ``dw_scales``, the
    factor on the Brownian increments (1: the sampler; 0.85: the claim's planted control); every
    factor sees the same references, noise and increments (common random numbers)."""
    n, ell = params["mmd_n"], mixture_scale(gmm)
    rhos = rho_grid(params["rho_max"], params["rho_min"], n=params["sw_steps"])
    out = [[] for _ in dw_scales]
    for _ in range(params["mmd_batches"]):
        ref = gmm.sample(n, rng)
        s_ref = _gram_sum(ref, None, ell)
        noise = params["rho_max"] * rng.standard_normal((n, 2))
        dws = sampler.brownian(rhos, noise.shape, rng) if sampler.stochastic else None
        for k, scale in enumerate(dw_scales):
            x = sampler.output(sampler.decode(sampler.init(noise), rhos,
                                              None if dws is None else [scale * dw for dw in dws]))
            out[k].append(mmd2_unbiased(x, ref, ell, self_y=s_ref) / q95 if np.all(np.isfinite(x)) else np.inf)
    return [np.array(o) for o in out]


def train(ctx) -> None:
    p = ctx.params
    if p.get("backend", "gmm") != "gmm":
        from .diffusers_backend import train_diffusers

        return train_diffusers(ctx)
    v = ctx.variant
    gmm = GaussianMixture.load(ctx.data["gmm2d"] / "gmm_params.npz")
    batches = np.load(ctx.shared_dir / "batches.npz")
    x_test, noise, y_ref = batches["x_test"], batches["noise"], batches["y_ref"]

    rt = []
    for n in p["steps_roundtrip"]:
        rhos = rho_grid(p["rho_max"], p["rho_min"], n)
        per_point = roundtrip_error(v, gmm.denoise, x_test, rhos, p, ctx.rng(10 + n), per_point=True)
        rt.append(float(np.max(per_point)))
        if n == max(p["steps_roundtrip"]):  # per test point (the test units), largest N
            ctx.metrics.units(f"roundtrip_err_pt_n{n}", per_point)
        ctx.progress(f"N={n}: round trip {rt[-1]:.3e} (exact score)")
    ctx.metrics.curve("roundtrip_err", p["steps_roundtrip"], _finite(rt))
    ctx.metrics.scalar("roundtrip_err_max", float(np.max(_finite(rt))))
    if v in ("rex_euler", "rex_sde"):
        # the round-trip claims' control: the same Rex with a coupling far from 1 (zeta_control):
        # its inverse divides by zeta every step, so round-off grows as zeta^-N and the same 1e-10
        # bound must flag it at the largest N
        ctl = {**p, "zeta": p["zeta_control"]}
        rt_c = [roundtrip_error(v, gmm.denoise, x_test, rho_grid(p["rho_max"], p["rho_min"], n), ctl,
                                ctx.rng(10 + n)) for n in p["steps_roundtrip"]]
        ctx.metrics.curve("roundtrip_err_zeta_ctrl", p["steps_roundtrip"], _finite(rt_c))
        ctx.progress(f"zeta = {p['zeta_control']}: round trips {['%.1e' % e for e in rt_c]}")
    if v == "rex_sde":
        # the other direction, claimed too (roundtrip_sde): data -> noise -> data from the test data
        # themselves, with freshly drawn increments stored and replayed (above: a sampled trajectory,
        # noise -> data, inverted and decoded again); and its control at zeta_control
        for name, prm in (("roundtrip_err_from_data", p), ("roundtrip_err_from_data_zeta_ctrl", ctl)):
            rt_d = [roundtrip_error(v, gmm.denoise, x_test, rho_grid(p["rho_max"], p["rho_min"], n), prm,
                                    ctx.rng(10 + n), from_data=True) for n in p["steps_roundtrip"]]
            ctx.metrics.curve(name, p["steps_roundtrip"], _finite(rt_d))
            if prm is p:
                claimed = max(_finite(rt) + _finite(rt_d))  # the claim's value: both directions
            ctx.progress(f"SDE round trip from the data (zeta = {prm['zeta']}): {['%.1e' % e for e in rt_d]}")
        # what the failure depends on (information, recorded since the review): the same round trips,
        # both directions, at zeta = 1 and at larger rho_min (the reference code floors rho_min near
        # 0.01); each the max over steps_roundtrip and both directions
        def sde_rt(prm):
            out = 0.0
            for n in p["steps_roundtrip"]:
                rhos = rho_grid(prm["rho_max"], prm["rho_min"], n)
                for fd in (False, True):
                    out = max(out, roundtrip_error(v, gmm.denoise, x_test, rhos, prm, ctx.rng(10 + n), from_data=fd))
            return out if np.isfinite(out) else 1.0e300

        for z in p["sde_zeta_sweep"]:
            r = sde_rt({**p, "zeta": z})
            ctx.metrics.scalar(f"roundtrip_sde_zeta{round(1000 * z):04d}", r)
            ctx.progress(f"SDE round trips at zeta = {z}: max {r:.1e}")
        sweep = [float(r) for r in p["sde_rho_min_sweep"]]
        vals = [claimed if r == p["rho_min"] else sde_rt({**p, "rho_min": r}) for r in sweep]  # reuse the claim's
        ctx.metrics.curve("roundtrip_sde_rho_min", sweep, vals)
        ctx.progress(f"SDE round trips at rho_min {sweep}: {['%.1e' % e for e in vals]}")
    # Sampling error against the DOP853 reference. Every Rex order is measured at the paper's
    # zeta = 0.999 (sample_err_paper_zeta, order_paper_zeta), except Rex-Euler's order claim: at
    # 0.999 Rex-Euler sits on its O(1 - zeta) coupling plateau over steps_conv (h*a >> 1 - zeta),
    # so its first order is measured at zeta_order, where h*a << 1 - zeta is reached.
    is_rex_ode = v.startswith("rex_") and v != "rex_sde"
    lin = make_sampler(v, gmm.denoise, p)
    at_paper_zeta: dict = {}  # per-noise errors {N: array} at the paper's zeta (reused below)
    if not lin.stochastic:
        if v == "rex_euler" or not is_rex_ode:  # baselines have no zeta
            sampler = make_sampler(v, gmm.denoise, {**p, "zeta": p["zeta_order"]}) if is_rex_ode else lin
            steps, errs = sampling_errors(sampler, noise, y_ref, p, per_noise=None if is_rex_ode else at_paper_zeta)
            ctx.metrics.curve("sample_err", steps, errs)
            ctx.metrics.scalar("order", empirical_order(steps, errs, p["error_floor"]))
            ctx.metrics.scalar("order_drift", order_drift(steps, errs, p["error_floor"]))
            ctx.progress(f"sampling errors {['%.2e' % e for e in errs]}"
                         + (f" (zeta = {p['zeta_order']})" if is_rex_ode else ""))
        if ode_order(v):
            ctx.metrics.scalar("expected_order", ode_order(v))
    if is_rex_ode:
        steps, errs = sampling_errors(lin, noise, y_ref, p, per_noise=at_paper_zeta)
        ctx.metrics.curve("sample_err_paper_zeta", steps, errs)
        ctx.metrics.scalar("order_paper_zeta", empirical_order(steps, errs, p["error_floor"]))
        ctx.metrics.scalar("order_drift_paper_zeta", order_drift(steps, errs, p["error_floor"]))
        # > 1 where the error grows with cost somewhere in the sweep (Rex-Euler's plateau)
        ctx.metrics.scalar("err_rise_paper_zeta", max(errs) / errs[0])
        ctx.metrics.scalar("stability_interval_theory", lin.stability_theory())
        ctx.progress(f"sampling errors at zeta = {p['zeta']}: {['%.2e' % e for e in errs]}")
    if not lin.stochastic:
        # at equal cost (denoiser evaluations per sample), the paper's zeta, every budget from
        # the paper's range (16-128) to the asymptotic one (rule below); per-noise units per budget
        per_budget: dict = {}
        nfes, errs = sampling_errors_at_nfe(v, gmm.denoise, noise, y_ref, p, at_paper_zeta, per_budget)
        ctx.metrics.curve("sample_err_nfe", nfes, errs)
        for budget, e in per_budget.items():
            ctx.metrics.units(f"sample_err_nfe{budget}", e)
        # the paper's range of budgets (16-128 evaluations, nfe_paper_max): the claim at the paper's cost
        paper = [k for k, b in enumerate(nfes) if b <= p["nfe_paper_max"]]
        ctx.metrics.curve("sample_err_nfe_paper", [nfes[k] for k in paper], [errs[k] for k in paper])
        # the asymptotic range, by the rule fixed in the spec and computed here from this run's own
        # curve (asymptotic_range: the first budget from which the local slopes agree within
        # asym_slope_tol); a claim comparing schemes reads the budgets common to their ranges
        asym, drift = asymptotic_range(nfes, errs, p["error_floor"], p["asym_slope_tol"])
        xa, ea = [nfes[k] for k in asym], [errs[k] for k in asym]
        ctx.metrics.curve("sample_err_nfe_asym", xa, ea)
        ctx.metrics.scalar("nfe_asym_start", float(xa[0]) if xa else float("nan"))
        ctx.metrics.scalar("nfe_asym_drift", drift)
        ctx.metrics.scalar("nfe_asym_slope", float(-np.polyfit(np.log(xa), np.log(ea), 1)[0]) if len(xa) > 1
                           else float("nan"))
        ctx.progress(f"asymptotic range (local slopes within {p['asym_slope_tol']}): NFE {xa}, spread {drift:.3f}")
        # "inverts exactly" read at each budget's own N; and on the budgets each claim reads (the
        # paper's, the scheme's asymptotic range), so that a precondition checks inversion there
        _, rt_nfe = roundtrip_at_nfe(v, gmm.denoise, x_test[:p["n_conv"]], p)
        ctx.metrics.curve("roundtrip_err_nfe", nfes, _finite(rt_nfe))
        ctx.metrics.curve("roundtrip_err_nfe_paper", [nfes[k] for k in paper], _finite([rt_nfe[k] for k in paper]))
        ctx.metrics.curve("roundtrip_err_nfe_asym", xa, _finite([rt_nfe[k] for k in asym]))
        # the paper's reconstruction test in float32 (recon_float32 claim): per test point, at the
        # paper's recon_steps; information at recon_steps_info (Rex-Euler at half the steps: equal
        # evaluations with BDIA); Rex-Euler also with its coupling at zeta_control (the control)
        den32 = denoiser_float32(gmm)
        for n_rec in [p["recon_steps"]] + list(p.get("recon_steps_info", [])):
            name = "recon32_mse" if n_rec == p["recon_steps"] else f"recon32_mse_n{n_rec}"
            mse = recon_float32(v, den32, x_test, n_rec, p)
            ctx.metrics.units(name, mse)
            if n_rec == p["recon_steps"]:  # the mean is set by a few points: its tail and median too
                ctx.metrics.scalar("recon32_mse_median", float(np.median(mse)))
                ctx.metrics.scalar("recon32_mse_p99", float(np.quantile(mse, 0.99)))
                ctx.metrics.scalar("recon32_mse_max", float(np.max(mse)))
            ctx.progress(f"float32 reconstruction, N = {n_rec}: mean MSE {np.mean(mse):.2e}, max {np.max(mse):.2e}")
        if v in ("bdia_vp", "bdia_vp_g096"):
            # the alpha convention's sensitivity (information, not a claim): sigma_data = 2 in alpha =
            # 1/sqrt(1 + (rho/sigma_data)^2), against the reference's sigma_data = 1
            sd2 = {**p, "bdia_sigma_data": 2.0}
            mse = recon_float32(v, den32, x_test, p["recon_steps"], sd2)
            ctx.metrics.units("recon32_mse_sd2", mse)
            # ... and the float arithmetic of the step (information): the difference form
            # D(k -> k+1) + gamma (x_{k-1} - D(k -> k-1)) instead of BDIA.py's coefficient form
            diff = recon_float32(v, den32, x_test, p["recon_steps"], {**p, "bdia_vp_grouping": "difference"})
            ctx.metrics.units("recon32_mse_diffform", diff)
            ctx.metrics.scalar("recon32_mse_diffform_median", float(np.median(diff)))
            ctx.progress(f"difference form: float32 reconstruction mean MSE {np.mean(diff):.2e}, "
                         f"median {np.median(diff):.2e}")
            _, e2 = sampling_errors_at_nfe(v, gmm.denoise, noise, y_ref,
                                           {**sd2, "nfe_budgets": [nfes[k] for k in paper]})
            ctx.metrics.curve("sample_err_nfe_paper_sd2", [nfes[k] for k in paper], e2)
            ctx.progress(f"sigma_data = 2: float32 reconstruction mean MSE {np.mean(mse):.2e}; sampling errors "
                         f"at the paper's budgets {['%.2e' % e for e in e2]}")
        if v == "rex_euler":
            mse = recon_float32(v, den32, x_test, p["recon_steps"], {**p, "zeta": p["zeta_control"]})
            ctx.metrics.units("recon32_mse_zeta_ctrl", mse)
            ctx.progress(f"float32 reconstruction at zeta = {p['zeta_control']}: mean MSE {np.mean(mse):.2e}")
        ctx.progress(f"sampling errors at NFE {nfes}: {['%.2e' % e for e in errs]}; "
                     f"round trips there {['%.1e' % e for e in rt_nfe]}")
    if v == "rex_euler":
        coupling_plateau(ctx, gmm, noise, y_ref, p)

    # the real stability interval of the linear step map, at the paper's zeta
    from ...blocks.ode import stability_interval

    ctx.metrics.scalar("stability_interval", stability_interval(lin.linear_step, lin.state_dim))

    # sample quality against the exact mixture, every variant at the same step count
    sw, sw_floor, nll_gap = sample_quality(lin, gmm, p, ctx.rng(4))
    ctx.metrics.scalar("sw", sw)
    ctx.metrics.scalar("sw_floor", sw_floor)
    ctx.metrics.scalar("nll_gap", nll_gap)
    ctx.progress(f"N={p['sw_steps']}: sliced W2 {sw:.4f} (exact-vs-exact floor {sw_floor:.4f})")
    if lin.stochastic:
        # the sample-quality claim: a kernel two-sample statistic (MMD^2_u, Gaussian kernel at the
        # mixture's component scale) per batch, over the 95 % quantile of its own exact-vs-exact
        # null drawn in this run; and its control, a planted partial error: the same sampler, same
        # references, noise and increments, with the increments scaled by sw_dw_scale
        null = mmd_null(gmm, p, ctx.rng(7))
        q95 = float(np.quantile(null, 0.95))
        ctx.metrics.scalar("mmd_null_q95", q95)
        ctx.metrics.scalar("mmd_null_sd", float(np.std(null)))
        ctx.metrics.scalar("mmd_bandwidth", mixture_scale(gmm))
        # the claim (increments x 1), its control (x sw_dw_scale) and the dose response: every
        # planted scale on the same references, noise and increments
        scales = [1.0] + [float(x) for x in p["mmd_dose_scales"]]
        ratios = mmd_test(lin, gmm, p, ctx.rng(4), q95, dw_scales=scales)
        for scale, r in zip(scales, ratios):
            name = "mmd_ratio" if scale == 1.0 else f"mmd_ratio_dw{round(100 * scale):03d}"
            ctx.metrics.units(name, r)
            if scale == p["sw_dw_scale"]:
                ctx.metrics.units("mmd_ratio_dw_scaled", r)
            ctx.progress(f"N={p['sw_steps']}, increments x {scale}: MMD^2_u / null q95 per batch "
                         f"{['%.2f' % v for v in r]} (mean {np.mean(r):.2f})")
        # dose response in the step count: the correct sampler at mmd_dose_steps (information)
        for n_steps in p["mmd_dose_steps"]:
            r = mmd_test(lin, gmm, {**p, "sw_steps": n_steps}, ctx.rng(4), q95)[0]
            ctx.metrics.units(f"mmd_ratio_n{n_steps}", r)
            ctx.progress(f"N={n_steps}: MMD^2_u / null q95 mean {np.mean(r):.2f}")

    counted = Counter(gmm.denoise)
    timed = make_sampler(v, counted, p)
    n = max(p["steps_roundtrip"])
    rhos = rho_grid(p["rho_max"], p["rho_min"], n)
    dws = timed.brownian(rhos, x_test.shape, ctx.rng(3)) if timed.stochastic else None
    t0 = time.perf_counter()
    timed.decode(timed.init(x_test * p["rho_max"]), rhos, dws)
    ctx.metrics.scalar("ms_per_step", 1e3 * (time.perf_counter() - t0) / n)
    ctx.metrics.scalar("nfe_per_step", counted.n / n)


CROSSOVER_BASES = ("bdia_vp", "bdia_vp_g096", "bdia_ve", "bdia_ve_g096", "bdia_lawson", "bdia_g096_lawson",
                   "reversible_heun")


def nfe_crossover(table) -> dict:
    """The crossover, recorded since the review: for Rex-RK4, Rex-midpoint and (since the third
    review) Rex-Euler against each exactly
    invertible baseline, the smallest budget from which Rex's seed-mean error at equal evaluations
    is below the baseline's at every larger budget (None: never). Information for the page."""
    sub = table[table.metric == "sample_err_nfe"]
    mean = {v: g.groupby("x").value.mean() for v, g in sub.groupby("variant")}
    out = {}
    for rex in ("rex_rk4", "rex_midpoint", "rex_euler"):
        for base in CROSSOVER_BASES:
            if rex not in mean or base not in mean:
                continue
            a, b = mean[rex], mean[base]
            xs = sorted(set(a.index) & set(b.index))
            start = None
            for x in reversed(xs):
                if a[x] < b[x]:
                    start = int(x)
                else:
                    break
            out[f"{rex} < {base}"] = start
    return out


# --- plots ---------------------------------------------------------------------------------------

def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot, plt

    curve_plot(table, "roundtrip_err", plots_dir / "curve_roundtrip_err.png", logx=True, logy=True,
               xlabel="steps N", ylabel="max |x_rec - x| (float64)",
               title="Round trip data->noise->data, exact score")
    curve_plot(table, "roundtrip_err_from_data", plots_dir / "curve_roundtrip_err_from_data.png", logx=True, logy=True,
               xlabel="steps N", ylabel="max |x_rec - x| (float64)",
               title="Stochastic Rex, data->noise->data (stored increments)")
    curve_plot(table, "roundtrip_sde_rho_min", plots_dir / "curve_roundtrip_sde_rho_min.png", logx=True, logy=True,
               xlabel="rho_min (smallest noise level of the grid)",
               ylabel="max round-trip error, both directions, N = steps_roundtrip",
               title="Stochastic Rex (zeta = 0.999): what roundtrip_sde depends on")
    p = plt()
    fig, ax = p.subplots(figsize=(5.5, 4))
    # Rex at the paper's zeta (sample_err_paper_zeta), Rex-Euler also at zeta_order (dashed),
    # the baselines (no zeta) from sample_err
    sub = table[(table.metric == "sample_err_paper_zeta")
                | ((table.metric == "sample_err") & ~table.variant.str.startswith("rex_"))]
    for v in sorted(sub.variant.unique()):
        g = sub[sub.variant == v].groupby("x").value.mean()
        ax.loglog(g.index, g.values, marker="o", ms=3, label=v, ls="--" if v == "bdia_lawson" else "-")
    eul = table[(table.metric == "sample_err") & (table.variant == "rex_euler")]
    if not eul.empty:
        g = eul.groupby("x").value.mean()
        ax.loglog(g.index, g.values, "k--", marker="o", ms=3, label=f"rex_euler, zeta = {params.get('zeta_order')}")
    if not sub.empty:
        xs = np.array(sorted(sub.x.unique()))
        y0 = sub.value.max()
        for order in (1, 2, 4):
            ax.loglog(xs, y0 * (xs / xs[0]) ** (-order), "k:", lw=0.8)
            ax.annotate(f"order {order}", (xs[-1], y0 * (xs[-1] / xs[0]) ** (-order)), fontsize=7)
    ax.set_xlabel("steps N")
    ax.set_ylabel("mean |y_N - y_ref|")
    ax.set_title(f"Error vs steps: the base order? (Rex at zeta = {params.get('zeta')})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    save_figure(fig, plots_dir / "curve_sample_err.png", dpi=110)
    p = plt()
    fig, ax = p.subplots(figsize=(8.5, 4.5))
    sub = table[table.metric == "sample_err_nfe"]
    for v in sorted(sub.variant.unique()):
        g = sub[sub.variant == v].groupby("x").value.mean()
        ax.loglog(g.index, g.values, marker="o", ms=3, label=v, ls="--" if v.startswith("bdia_") else "-",
                  lw=2.0 if v in ("bdia_vp", "bdia_vp_g096", "rex_euler", "rex_rk4") else 1.0)
    ax.axvspan(min(params.get("nfe_budgets", [16])), params.get("nfe_paper_max", 128), color="0.9", zorder=0,
               label="the paper's budgets")
    cross = nfe_crossover(table)
    if cross:
        import json

        (plots_dir / "crossover.json").write_text(json.dumps(cross, indent=1))
        # beside the axes, below the legend (they overlapped it inside the axes before): the
        # crossovers against the paper's BDIA and the Lawson-variable ones
        shown = [f"{name}: {b if b is not None else 'never'}" for name, b in cross.items()
                 if name.split(" < ")[1] in ("bdia_vp", "bdia_vp_g096", "bdia_lawson", "reversible_heun")]
        ax.text(1.02, 0.0, "crossover (Rex below from NFE)\n" + "\n".join(shown), fontsize=5.5, va="bottom",
                ha="left", transform=ax.transAxes)
    ax.set_xlabel("denoiser evaluations per sample (NFE)")
    ax.set_ylabel("mean |y - y_ref|")
    ax.set_title(f"Equal cost, zeta = {params.get('zeta')}", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    save_figure(fig, plots_dir / "curve_sample_err_nfe.png", dpi=110)
    curve_plot(table, "roundtrip_err_nfe", plots_dir / "curve_roundtrip_err_nfe.png", logx=True, logy=True,
               xlabel="denoiser evaluations per sample (NFE)", ylabel="max |x_rec - x| (float64)",
               title="Round trip at each budget's own step count (exact score)")
    curve_plot(table, "sample_err_paper_zeta", plots_dir / "curve_sample_err_paper_zeta.png", logx=True, logy=True,
               xlabel="steps N", ylabel="mean |y_N - y_ref|",
               title="At the paper's zeta = 0.999: where does Rex-Euler plateau?")
    curve_plot(table, "plateau_bias", plots_dir / "curve_plateau_bias.png", logx=True, logy=True,
               xlabel="1 - zeta", ylabel="mean |y_zeta - y_(zeta=1)| at N = plateau_steps",
               title="Is Rex-Euler's coupling bias proportional to 1 - zeta?")
    sub = table[table.metric.isin(["recon32_mse", "recon32_mse_zeta_ctrl"]) & table.x.isna()]
    if not sub.empty:  # the float32 reconstruction claim: mean per-point MSE, every ODE sampler
        p = plt()
        fig, ax = p.subplots(figsize=(6, 4))
        g = sub.assign(name=np.where(sub.metric == "recon32_mse", sub.variant, sub.variant + ", zeta = "
                                     + str(params.get("zeta_control")))).groupby("name").value
        names = sorted(g.groups)
        ax.bar(names, g.mean()[names], color=["C3" if n.startswith("rex_euler") else "C0" for n in names])
        ax.set_yscale("log")
        ax.set_ylabel("mean per-point MSE (float32 round trip)")
        ax.set_title(f"float32 reconstruction, N = {params.get('recon_steps')} steps", fontsize=10)
        ax.tick_params(axis="x", rotation=35, labelsize=7)
        save_figure(fig, plots_dir / "bar_recon_float32.png", dpi=110)
    sub = table[table.metric.isin(["sw", "sw_floor"])]
    if not sub.empty:
        p = plt()
        fig, ax = p.subplots(figsize=(6, 4))
        g = sub[sub.metric == "sw"].groupby("variant").value
        floor = sub[sub.metric == "sw_floor"].value.mean()
        names = sorted(g.groups)
        ax.bar(names, g.mean()[names], yerr=g.std().fillna(0.0)[names], color="C0")
        ax.axhline(floor, color="k", ls="--", lw=1, label="exact vs exact (finite-sample floor)")
        ax.set_yscale("log")
        ax.set_ylabel("sliced W2 to exact mixture samples (data units)")
        ax.set_title(f"Do the samplers sample the mixture at N = {params.get('sw_steps')}?")
        ax.tick_params(axis="x", rotation=30)
        ax.legend(fontsize=7)
        save_figure(fig, plots_dir / "bar_sliced_w2.png", dpi=110)
    sub = table[(table.variant == "rex_sde") & table.metric.isin(["mmd_ratio#unit", "mmd_ratio_dw_scaled#unit"])]
    if not sub.empty:
        p = plt()
        fig, ax = p.subplots(figsize=(5.5, 4))
        for k, metric in enumerate(("mmd_ratio#unit", "mmd_ratio_dw_scaled#unit")):
            g = sub[sub.metric == metric]
            jitter = 0.08 * (g.seed.to_numpy() - g.seed.mean())
            ax.scatter(k + jitter, g.value, s=12, color=f"C{k}", alpha=0.7)
            ax.errorbar(k, g.value.mean(), yerr=g.value.std(), fmt="ks", ms=6, capsize=4)
        ax.axhline(1.0, color="r", ls=":", lw=1, label="claim threshold: the exact-vs-exact null's 95 % quantile")
        ax.axhline(0.0, color="k", lw=0.5)
        ax.set_xticks([0, 1], ["stochastic Rex", f"increments x {params.get('sw_dw_scale')} (control)"])
        ax.set_ylabel("MMD^2_u per batch / null 95 % quantile")
        ax.set_title(f"Samples the mixture? N = {params.get('sw_steps')}, {params.get('mmd_n')} a batch",
                     fontsize=10)
        ax.legend(fontsize=7)
        save_figure(fig, plots_dir / "strip_mmd_ratio.png", dpi=110)
    sub = table[(table.variant == "rex_sde") & table.metric.str.match(r"^mmd_ratio(_dw\d{3}|_n\d+)?#unit$")]
    if not sub.empty:  # the dose response of the sample-quality test
        p = plt()
        fig, ax = p.subplots(figsize=(5.5, 4))
        def order(m):
            m = m.split("#")[0]
            return (0, 0) if m == "mmd_ratio" else (1, -int(m[-3:])) if "_dw" in m else (2, -int(m.split("_n")[-1]))

        names = sorted(sub.metric.unique(), key=order)
        g = sub.groupby("metric").value

        def label(m):
            m = m.split("#")[0]
            return (f"x 1.00, N = {params.get('sw_steps')}" if m == "mmd_ratio" else f"x {int(m[-3:]) / 100:.2f}" if "_dw" in m
                    else f"x 1.00, N = {m.split('_n')[-1]}")

        labels = [label(m) for m in names]
        ax.bar(labels, g.mean()[names], yerr=g.std()[names], color="C0")
        ax.axhline(1.0, color="r", ls=":", lw=1, label="threshold: the null's 95 % quantile")
        ax.set_ylabel("MMD^2_u per batch / null 95 % quantile")
        ax.set_title("Dose response: Brownian increments scaled (x) or fewer steps (N)", fontsize=9)
        ax.tick_params(axis="x", rotation=25, labelsize=8)
        ax.legend(fontsize=7)
        save_figure(fig, plots_dir / "bar_mmd_dose.png", dpi=110)
