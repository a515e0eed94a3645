"""Spiking second-order SSM layers (harmonic resonate-and-fire) and the baselines' networks.

The neuron of S-H²RF-SSM is a damped harmonic oscillator driven by the input current x(t):

    u' = -ω² v - 2 b u + x,      v' = u        (v: membrane, u: its velocity; ω, b in rad/step, 1/step)

spiking s_t = H(u_t - θ) on the velocity, as the paper's HRF neuron z = Θ(u - θ) (``spike_on="v"``
spikes on the membrane instead), surrogate gradient backward. Heterogeneous: each channel c has its
own ω_c, b_c (a bank of band-pass filters), drawn at random (ω ~ U(omega_range), b/ω log-uniform in
zeta_range; ``init="logspaced"`` lays them on a grid instead); homogeneous: one ω, b for all channels.
Training keeps every channel in the box ω ∈ [OMEGA_MIN, 1.9/Δt], ζ = b/ω < ZETA_MAX = 0.5, where both
schemes have a complex pole pair (|cos ϑ| < 1 - 1e-5, tested), so the closed forms below hold exactly;
a real (overdamped) pair is refused rather than clamped onto a wrong kernel.

Discretisation (IMEX: damping implicit, restoring force explicit, step Δt):

    u_t = (u_{t-1} + Δt (x_t - ω² v_{t-1})) / (1 + 2bΔt),      v_t = v_{t-1} + Δt u_t

This is the linear recurrence (u, v)_t = A (u, v)_{t-1} + B x_t with a = 1/(1 + 2bΔt),
A = [[a, -aΔtω²], [aΔt, 1 - aΔt²ω²]], B = (aΔt, aΔt²); det A = a, tr A = 1 + a - aΔt²ω². Its
eigenvalues are λ, λ̄ = r e^{±iϑ} with r = √a < 1 (stable for any b > 0), cos ϑ = tr / (2r), and
by Cayley-Hamilton the membrane's impulse response is

    h_k = aΔt² (λ^{k+1} - λ̄^{k+1}) / (λ - λ̄) = aΔt² r^k sin((k+1)ϑ) / sin ϑ,     k = 0, 1, ...

so without reset the layer is the causal convolution v = h * x (+ D x, the SSM's skip term),
computed for the whole sequence by FFT in O(L log L) (``blocks.spiking.causal_fft_conv``) with
Im λ^{k+1} = r^{k+1} sin((k+1)ϑ) in real arithmetic; the threshold is applied pointwise afterwards. The velocity's
response is g_k = (h_k - h_{k-1}) / Δt (``velocity_kernel``). The sequential
recurrence (``imex_recurrence``) is kept as the reference the FFT path is tested against.

Other kernels on the same layer: ``implicit`` = the fully implicit (backward Euler) scheme, the
paper's other discretisation (``implicit_kernel``: pole modulus 1/√(1 + 2bΔt + Δt²ω²), extra
numerical damping growing with ω; ``implicit_recurrence`` its reference); ``cdiag`` = a first-order
complex-diagonal SSM (S4D / LRU style), h_k = Re(e^{iφ} λ^k), one complex state per channel, poles
drawn as the resonators' (``complex_diagonal_kernel``; no velocity differencing); ``sampled`` = the continuous impulse response
e^{-bt} sin(ω_d t)/ω_d sampled at t = kΔt (``blocks.spiking.harmonic_rf_kernel``, impulse
invariance, the ablation of the discretisation) and ``lif`` = the first-order kernel β^k
(leaky integrator, the first-order spiking SSM baseline, spiking on its one state). Every kernel
is normalised to unit ℓ2 norm per channel over its first ``norm_horizon`` steps (over the sequence
if None), so all variants feed the threshold currents of one scale and, with a fixed horizon, a
filter does not depend on the length of the sequence it is applied to.

Network (all spiking variants): pointwise encoder (d_in -> C) -> spiking SSM layer -> pointwise
mixing of the spikes (C -> C, additions only) -> spiking SSM layer -> kernel-based read-out. The
read-out is the paper's "kernel-based spiking regressor" as we read it: features
f_c = Σ_k ρ_c(k) s_c(L-1-k) with a learned exponential kernel ρ_c(k) ∝ exp(-k / (τ_c L)) over the
last layer's spikes (so, with binary spikes, additions only), then a linear map to the output.
"""
from __future__ import annotations


import torch
from torch import nn

from ...blocks.spiking import SURROGATES, causal_fft_conv, harmonic_rf_kernel, spike


# the layer's parameter box: ω in [OMEGA_MIN, OMEGA_MAX_DT / Δt] (below the IMEX stability edge ω Δt < 2),
# damping ratio ζ = b/ω in (0, ZETA_MAX): inside it both schemes are underdamped with |cos ϑ| < 1 - 1e-5
# (implicit: iff ζ < 1; IMEX: checked over the box in tests/test_sh2rfssm.py)
OMEGA_MIN, OMEGA_MAX_DT, ZETA_MAX = 0.01, 1.9, 0.5


def _underdamped_cos(cos_t: torch.Tensor) -> torch.Tensor:
    """cos ϑ of a complex pole pair; refuses a real (overdamped or critical) pair instead of clamping
    it onto an underdamped kernel it is not (the closed forms here are for complex pairs only).
    Float rounding within 1e-6 of ±1 is clipped."""
    if bool((cos_t.detach().abs() >= 1.0 + 1e-6).any()):
        raise ValueError("overdamped pole pair (|tr| >= 2 sqrt(det)): outside the layer's parameter box")
    return cos_t.clamp(-1 + 1e-7, 1 - 1e-7)


def imex_kernel(omega: torch.Tensor, damping: torch.Tensor, length: int, dt: float = 1.0) -> torch.Tensor:
    """Membrane impulse response h_k (channels, L) of the IMEX-discretised harmonic oscillator."""
    omega = torch.as_tensor(omega, dtype=torch.float32).reshape(-1)
    b = torch.as_tensor(damping, dtype=torch.float32).reshape(-1)
    a = 1.0 / (1.0 + 2.0 * b * dt)
    tr = 1.0 + a - a * (dt * omega) ** 2
    r = torch.sqrt(a)
    # underdamped (complex pair) when tr² < 4a: the layer's parametrisation (ω in [OMEGA_MIN, 1.9/Δt],
    # ζ = b/ω ≤ ZETA_MAX) keeps |cos ϑ| ≤ 1 - 1e-5 (tests/test_sh2rfssm.py, over the whole box);
    # an overdamped pair is refused, not clamped onto a wrong kernel
    cos_t = _underdamped_cos(tr / (2 * r))
    theta = torch.acos(cos_t)
    # Im λ^{k+1} = r^{k+1} sin((k+1)ϑ), k = 0..L-1, in real arithmetic (the complex power
    # ``blocks.spiking.rf_kernel`` gives the same numbers; real autograd is cheaper per step)
    k1 = torch.arange(1, length + 1, dtype=torch.float32)
    im_pow = torch.exp(k1 * torch.log(r).unsqueeze(-1)) * torch.sin(k1 * theta.unsqueeze(-1))
    return (a * dt ** 2 / (r * torch.sin(theta))).unsqueeze(-1) * im_pow


def second_order_kernel(tr: torch.Tensor, det: torch.Tensor, h0: torch.Tensor, h1: torch.Tensor,
                        length: int) -> torch.Tensor:
    """h_k (channels, L) of the recurrence h_{k+1} = tr h_k - det h_{k-1} from h_0, h_1, for a
    complex pair λ, λ̄ = r e^{±iϑ} (r = √det, cos ϑ = tr / 2r):
    h_k = r^k (h_0 cos kϑ + (h_1 / r - h_0 cos ϑ) sin kϑ / sin ϑ)  (Cayley-Hamilton, any 2 x 2 system)."""
    r = torch.sqrt(det)
    cos_t = _underdamped_cos(tr / (2 * r))
    theta = torch.acos(cos_t)
    k = torch.arange(length, dtype=torch.float32)
    rk = torch.exp(k * torch.log(r).unsqueeze(-1))
    c2 = (h1 / r - h0 * cos_t) / torch.sin(theta)
    return rk * (h0.unsqueeze(-1) * torch.cos(k * theta.unsqueeze(-1)) + c2.unsqueeze(-1) * torch.sin(k * theta.unsqueeze(-1)))


def implicit_kernel(omega: torch.Tensor, damping: torch.Tensor, length: int, dt: float = 1.0) -> torch.Tensor:
    """Membrane impulse response of the fully implicit (backward) Euler discretisation, the paper's
    other scheme: u_t = u_{t-1} + Δt (x_t - ω² v_t - 2b u_t), v_t = v_{t-1} + Δt u_t, i.e.
    M (u, v)_t = (u_{t-1} + Δt x_t, v_{t-1}) with M = [[1 + 2bΔt, Δtω²], [-Δt, 1]], D = det M =
    1 + 2bΔt + Δt²ω²; A = M⁻¹ has det 1/D and trace (2 + 2bΔt)/D; h_0 = Δt²/D, h_1 = Δt² (2 + 2bΔt)/D²."""
    omega = torch.as_tensor(omega, dtype=torch.float32).reshape(-1)
    b = torch.as_tensor(damping, dtype=torch.float32).reshape(-1)
    d = 1.0 + 2.0 * b * dt + (dt * omega) ** 2
    tr = (2.0 + 2.0 * b * dt) / d
    return second_order_kernel(tr, 1.0 / d, dt ** 2 / d, dt ** 2 * (2.0 + 2.0 * b * dt) / d ** 2, length)


def implicit_recurrence(x: torch.Tensor, omega: torch.Tensor, damping: torch.Tensor, dt: float = 1.0) -> torch.Tensor:
    """The implicit scheme step by step (reference): x (..., C, L) -> membrane v (..., C, L)."""
    omega = torch.as_tensor(omega, dtype=x.dtype)
    b = torch.as_tensor(damping, dtype=x.dtype)
    d = 1.0 + 2.0 * b * dt + (dt * omega) ** 2
    u = torch.zeros_like(x[..., 0])
    v = torch.zeros_like(x[..., 0])
    out = []
    for t in range(x.shape[-1]):
        u = (u + dt * x[..., t] - dt * omega ** 2 * v) / d
        v = v + dt * u
        out.append(v)
    return torch.stack(out, dim=-1)


def complex_diagonal_kernel(log_decay: torch.Tensor, freq: torch.Tensor, phase: torch.Tensor,
                            length: int) -> torch.Tensor:
    """First-order complex-diagonal SSM (S4D / LRU style): one complex state per channel,
    z_t = λ z_{t-1} + x_t, y_t = Re(e^{iφ} z_t), λ = exp(-e^{log_decay} + i freq), so
    h_k = Re(e^{iφ} λ^k) = e^{-k e^{log_decay}} cos(k freq + φ) (real arithmetic)."""
    k = torch.arange(length, dtype=torch.float32)
    decay = log_decay.exp().unsqueeze(-1)
    return torch.exp(-k * decay) * torch.cos(k * freq.unsqueeze(-1) + phase.unsqueeze(-1))


def imex_recurrence(x: torch.Tensor, omega: torch.Tensor, damping: torch.Tensor, dt: float = 1.0) -> torch.Tensor:
    """The same layer step by step: x (..., C, L) -> membrane v (..., C, L). Reference path."""
    omega = torch.as_tensor(omega, dtype=x.dtype)
    b = torch.as_tensor(damping, dtype=x.dtype)
    a = 1.0 / (1.0 + 2.0 * b * dt)
    u = torch.zeros_like(x[..., 0])
    v = torch.zeros_like(x[..., 0])
    out = []
    for t in range(x.shape[-1]):
        u = a * (u + dt * (x[..., t] - omega ** 2 * v))
        v = v + dt * u
        out.append(v)
    return torch.stack(out, dim=-1)


def lif_kernel(beta: torch.Tensor, length: int) -> torch.Tensor:
    """First-order kernel β^k (channels, L): a leaky integrator v_t = β v_{t-1} + x_t."""
    beta = torch.as_tensor(beta, dtype=torch.float32).reshape(-1)
    return torch.exp(torch.arange(length, dtype=torch.float32) * torch.log(beta).unsqueeze(-1))


def velocity_kernel(h: torch.Tensor, dt: float = 1.0) -> torch.Tensor:
    """The velocity's impulse response from the membrane's: the IMEX update v_t = v_{t-1} + Δt u_t
    gives u_t = (v_t - v_{t-1}) / Δt, so g_k = (h_k - h_{k-1}) / Δt with h_{-1} = 0."""
    return torch.diff(h, dim=-1, prepend=torch.zeros_like(h[..., :1])) / dt


KERNELS = ("imex", "implicit", "sampled", "lif", "cdiag")


class SpikingSSMLayer(nn.Module):
    """y = h * I + D I (FFT), s = H(y - θ). ``kernel``: imex | implicit | sampled | lif | cdiag; ``shared``: one ω, b;
    ``spike_on``: the state that crosses the threshold, ``u`` (the velocity, as in the paper's HRF
    neuron z = Θ(u - θ)) or ``v`` (the membrane); the first-order kernel has one state only."""

    def __init__(self, channels: int, kernel: str = "imex", shared: bool = False, dt: float = 1.0,
                 omega_range: tuple[float, float] = (0.1, 1.0), zeta_range: tuple[float, float] = (0.01, 0.1),
                 tau_range: tuple[float, float] = (2.0, 200.0), threshold: float = 1.0,
                 surrogate: str = "arctan", spike_on: str = "u", init: str = "random",
                 norm_horizon: int | None = None):
        super().__init__()
        self.norm_horizon = norm_horizon
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        self.kernel, self.dt, self.threshold = kernel, dt, threshold
        self.surrogate = SURROGATES[surrogate]()
        if spike_on not in ("u", "v"):
            raise ValueError(f"spike_on must be 'u' (velocity, the paper) or 'v' (membrane), got {spike_on!r}")
        if init not in ("random", "logspaced"):
            raise ValueError(f"init must be 'random' or 'logspaced', got {init!r}")
        self.spike_on = spike_on
        n = 1 if shared else channels
        # random (default): every channel draws its own parameters from torch's generator (seeded
        # by the caller), ω ~ U(omega_range), ζ and τ log-uniform, so the bank is not tuned to any
        # task before training; logspaced: the deterministic grid of the earlier miniature
        if init == "random":
            grid, grid_z = torch.rand(n), torch.rand(n)
        else:
            grid = torch.linspace(0, 1, channels)[:n] if n > 1 else torch.tensor([0.5])
            grid_z = torch.full((n,), 0.5)
        if kernel == "lif":
            tau = tau_range[0] * (tau_range[1] / tau_range[0]) ** grid  # log-uniform time constants (steps)
            self.raw = nn.Parameter(torch.log(tau))  # β = exp(-1/τ)
        else:
            if init == "random":
                omega = omega_range[0] + (omega_range[1] - omega_range[0]) * grid  # uniform (rad/step)
            else:
                omega = omega_range[0] * (omega_range[1] / omega_range[0]) ** grid  # log-spaced bank
            zeta = zeta_range[0] * (zeta_range[1] / zeta_range[0]) ** grid_z  # damping ratio b / ω
            if kernel == "cdiag":
                # the same draws of ω and ζ as the resonators' bank: pole λ = exp(-ζω + iω√(1-ζ²)),
                # the continuous oscillator's; a learned output phase φ (init 0) per channel
                self.log_decay = nn.Parameter(torch.log(zeta * omega))
                self.freq = nn.Parameter(omega * torch.sqrt(1 - zeta ** 2))
                self.phase = nn.Parameter(torch.zeros(n))
            else:
                self.log_omega = nn.Parameter(torch.log(omega))
                # ζ = ZETA_MAX σ(logit): bounded inside the underdamped box whatever training does
                self.logit_zeta = nn.Parameter(torch.log(zeta / (ZETA_MAX - zeta)))
        self.skip = nn.Parameter(torch.zeros(channels))
        self.channels = channels

    def omega_damping(self) -> tuple[torch.Tensor, torch.Tensor]:
        omega = self.log_omega.exp().clamp(min=OMEGA_MIN / self.dt, max=OMEGA_MAX_DT / self.dt)
        return omega, omega * ZETA_MAX * torch.sigmoid(self.logit_zeta)

    def impulse_response(self, length: int) -> torch.Tensor:
        """The layer's kernel over ``length`` steps, scaled to unit ℓ2 norm over the first
        ``norm_horizon`` steps (over the sequence if None): with a fixed horizon the filter does
        not depend on the length of the sequence it is applied to, so a model trained at one L
        runs unchanged at another."""
        n = length if self.norm_horizon is None else max(length, int(self.norm_horizon))
        if self.kernel == "lif":
            h = lif_kernel(torch.exp(-torch.exp(-self.raw)), n)
        elif self.kernel == "cdiag":
            h = complex_diagonal_kernel(self.log_decay, self.freq, self.phase, n)
        else:
            omega, b = self.omega_damping()
            h = {"imex": imex_kernel, "implicit": implicit_kernel,
                 "sampled": harmonic_rf_kernel}[self.kernel](omega, b, n, self.dt)
        if self.spike_on == "u" and self.kernel not in ("lif", "cdiag"):
            h = velocity_kernel(h, self.dt)
        horizon = length if self.norm_horizon is None else int(self.norm_horizon)
        h = h[:, :length] / h[:, :horizon].norm(dim=-1, keepdim=True).clamp(min=1e-8)
        return h.expand(self.channels, length)

    def forward(self, current: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v = causal_fft_conv(current, self.impulse_response(current.shape[-1])) + self.skip[:, None] * current
        return spike(v - self.threshold, self.surrogate), v


def _zero(head: nn.Linear, scale: float = 0.1) -> None:
    """Small output layer: zero bias, weights scaled to ``scale`` (10 %) of PyTorch's default, so
    every model starts near the chance prediction (uniform class probabilities, the target mean for
    the standardised adding target; tested within 6 % of the chance loss), and the training rule's
    ``min_progress`` measures progress from chance. Not zero: with a zero head and no spikes at
    initialisation (the adding task's second layer) no gradient reaches the network, and it never
    learns (smoke pilot, seed 0: sh2rf's adding R² -0.008 after 3000 steps); at 1 % the seed-0 pilot
    chose the lowest rate for sh2rf and the transformer on adding and both ran to 3000 steps
    unconverged; at 10 % both chose 3e-2 and stopped on a gate-passing plateau (probes of ``fit``)."""
    with torch.no_grad():
        head.weight.mul_(scale)
    nn.init.zeros_(head.bias)


class SpikingSSM(nn.Module):
    """encoder -> spiking SSM layer -> spike mixing -> spiking SSM layer -> kernel read-out."""

    def __init__(self, d_in: int, n_out: int, channels: int = 16, **layer_kw):
        super().__init__()
        self.enc = nn.Conv1d(d_in, channels, 1)
        self.layer1 = SpikingSSMLayer(channels, **layer_kw)
        self.mix = nn.Conv1d(channels, channels, 1)
        self.layer2 = SpikingSSMLayer(channels, **layer_kw)
        self.log_tau = nn.Parameter(torch.zeros(channels))  # read-out decay in units of L
        self.head = nn.Linear(channels, n_out)
        _zero(self.head)
        # operations one spike costs: a layer-1 spike reaches the C mixing synapses (C additions); a
        # layer-2 spike is one accumulation into its channel's read-out feature (adding the stored kernel
        # value ρ_c(k)). The head's C x n_out multiply-adds act once per sequence on the features, not
        # per spike (``dense_ops_per_step``), and are the same for every spiking variant
        self.fan_outs = (channels, 1)
        self.dense_ops = channels * n_out

    def readout_kernel(self, length: int) -> torch.Tensor:
        k = torch.arange(length, dtype=torch.float32).flip(0)  # lag L-1-t of step t
        w = torch.exp(-k[None] / (self.log_tau.exp()[:, None] * length))
        return w / w.sum(-1, keepdim=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        s1, _ = self.layer1(self.enc(x))
        s2, _ = self.layer2(self.mix(s1))
        feats = (s2 * self.readout_kernel(x.shape[-1])).sum(-1)
        return self.head(feats), [s1, s2]


class GRUNet(nn.Module):
    """Non-spiking recurrent baseline: GRU over time, last hidden state -> linear."""

    def __init__(self, d_in: int, n_out: int, hidden: int = 32):
        super().__init__()
        self.gru = nn.GRU(d_in, hidden, batch_first=True)
        self.head = nn.Linear(hidden, n_out)

    def forward(self, x):
        _, h = self.gru(x.transpose(1, 2))
        return self.head(h[-1]), []


class TransformerNet(nn.Module):
    """Small non-spiking transformer encoder, mean pool. Tokens: ``patch`` = 1, one per step (a linear
    embedding and learned positions); ``patch`` > 1, one per patch of that many steps taken every
    ``stride`` steps (default ``patch``: non-overlapping), as time-series transformers tokenise
    (PatchTST: patch 16, stride 8, so neighbouring patches overlap by half): a pointwise MLP
    (d_in -> dim, GELU, so a token can hold products such as value x marker) and a strided linear map
    over the patch, then learned positions. The windows must tile L exactly (L >= ``patch``, L - patch
    a multiple of ``stride``): the tokens are its (L - patch) / stride + 1 windows."""

    def __init__(self, d_in: int, n_out: int, length: int, dim: int = 32, depth: int = 2, heads: int = 4,
                 patch: int = 1, depthwise: bool = False, stride: int | None = None):
        super().__init__()
        self.patch = int(patch)
        self.stride = int(stride) if stride else self.patch
        if self.patch > 1 and not 1 <= self.stride <= self.patch:
            raise ValueError(f"stride {self.stride}: expected 1 <= stride <= patch ({self.patch})")
        if self.patch == 1:
            self.embed = nn.Conv1d(d_in, dim, 1)
        else:
            # depthwise: each embedding channel sums its own patch (dim x patch weights instead of
            # dim² x patch), so a parameter-matched transformer keeps its budget for attention
            self.embed = nn.Sequential(nn.Conv1d(d_in, dim, 1), nn.GELU(),
                                       nn.Conv1d(dim, dim, self.patch, stride=self.stride,
                                                 groups=dim if depthwise else 1))
        n_tok = length if self.patch == 1 else max(1, (length - self.patch) // self.stride + 1)
        self.pos = nn.Parameter(0.02 * torch.randn(1, n_tok, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, 0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(dim, n_out)
        _zero(self.head)

    def forward(self, x):
        if self.patch > 1 and (x.shape[-1] < self.patch or (x.shape[-1] - self.patch) % self.stride):
            raise ValueError(f"sequence length {x.shape[-1]}: the patches ({self.patch} steps every "
                             f"{self.stride}) must tile it exactly")
        tok = self.embed(x).transpose(1, 2)
        h = self.blocks(tok + self.pos[:, : tok.shape[1]])
        return self.head(h.mean(1)), []


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def matched_dim(d_in: int, n_out: int, length: int, arch: dict, target: int) -> int:
    """The transformer width (1 head, depth ``arch.depth``, depthwise patches) whose parameter count is
    nearest ``target`` (the heterogeneous spiking network's on the same task)."""
    counts = {d: n_params(TransformerNet(d_in, n_out, length, dim=d, depth=int(arch["depth"]), heads=1,
                                         patch=int(arch.get("patch", 1)), depthwise=True,
                                         stride=arch.get("stride")))
              for d in range(2, 65)}
    return min(counts, key=lambda d: (abs(counts[d] - target), d))


def build(family: str, d_in: int, n_out: int, length: int, options: dict, arch: dict) -> nn.Module:
    if family == "transformer" and arch.get("dim") == "match":
        # parameter-matched: the width whose count is nearest the method's (sh2rf, heterogeneous IMEX)
        with torch.random.fork_rng(devices=[]):  # counting draws no numbers from the caller's stream
            ref = n_params(build("ssm", d_in, n_out, length, {"kernel": "imex", "shared": False}, arch))
            dim = matched_dim(d_in, n_out, length, arch, ref)
        return TransformerNet(d_in, n_out, length, dim=dim, depth=int(arch["depth"]), heads=1,
                              patch=int(arch.get("patch", 1)), depthwise=True, stride=arch.get("stride"))
    if family == "ssm":
        return SpikingSSM(d_in, n_out, channels=int(arch["channels"]), kernel=options["kernel"],
                          shared=bool(options.get("shared", False)),
                          omega_range=tuple(arch["omega_range"]), zeta_range=tuple(arch["zeta_range"]),
                          tau_range=tuple(arch["tau_range"]), surrogate=arch.get("surrogate", "arctan"),
                          spike_on=arch.get("spike_on", "u"), init=arch.get("init", "random"),
                          norm_horizon=arch.get("norm_horizon"))
    if family == "gru":
        return GRUNet(d_in, n_out, hidden=int(arch["hidden"]))
    if family == "transformer":
        return TransformerNet(d_in, n_out, length, dim=int(arch["dim"]), depth=int(arch["depth"]),
                              heads=int(arch["heads"]), patch=int(arch.get("patch", 1)),
                              stride=arch.get("stride"))
    raise ValueError(f"unknown model family {family!r}")
