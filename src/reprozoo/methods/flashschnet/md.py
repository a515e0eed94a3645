"""Force evaluators (baseline vs flash, same weights) for replicas of a chain, MD benchmarks.

``Evaluator(kind, model, types, n_replicas, ...)`` evaluates prior + SchNet energy and forces on
positions (R, N, 3) with a Verlet neighbour list (cutoff + skin, rebuilt when a bead moved more
than skin / 2; pairs beyond the cutoff get a zero envelope, so results do not depend on the skin).
``kind``: 'baseline' (blocks.atomistic.SchNet, (E, F) tensors + index_add_), 'flash_paper'
(:class:`FlashSchNet` with the paper's memory pattern: (E, K) basis once, per-block (E, F) filter
kept, envelope/gather/multiply/CSR reduction fused; optionally W16A16 or other weight formats) or
'flash' (our recompute kernel: no (E, K) or (E, F) tensor, the filter recomputed per chunk in the
backward pass; an ablation). All share one ``SchNet`` instance.
``pairs``: evaluate each unordered pair's filter once (our ablation, for either kind; the list of
pairs is built with the neighbour list, so its cost is counted in MD).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ...blocks.atomistic import SchNet, radius_graph
from .cgchain import ChainPotential, ChainSystem, langevin_baoab, maxwell_boltzmann, velocity_verlet, KB
from .baseline_pairs import PairBaselineSchNet, unordered_pairs
from .flash import FlashSchNet, build_graph
from .measure import peak_bytes

KINDS = ("baseline", "flash", "flash_paper")


VARIANTS = {  # variant id -> (kind, weight format or None, pair symmetry)
    "flashschnet": ("flash_paper", None, False),              # the paper's kernel (techniques 1-3), fp32
    "flashschnet_w16a16": ("flash_paper", "w16a16", False),   # + technique 4 as the public code does it
    "flashschnet_fp16w": ("flash_paper", "float16", False),   # ablation (ours): per-channel 16-bit weights only
    "flashschnet_bf16w": ("flash_paper", "bfloat16", False),
    "flashschnet_int16w": ("flash_paper", "int16", False),
    "flashschnet_int4w": ("flash_paper", "int4", False),      # control: per-channel 4-bit weights (intermediate)
    "flashschnet_int2w": ("flash_paper", "int2", False),      # control: ternary weights, too coarse
    "flash_recompute": ("flash", None, False),                # ablation (ours): recompute kernel, no (E, F)
    "flash_pairs": ("flash", None, True),                     # ablation (ours): + each pair's filter once
    "baseline_schnet": ("baseline", None, False),             # CGSchNet-style
    "baseline_pairs": ("baseline", None, True),               # ablation (ours): the baseline with the same trick
}


def variant_kind(variant: str) -> tuple[str, str | None, bool]:
    """variant id -> (kind, quantize, pairs)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown flashschnet variant '{variant}'; allowed: {sorted(VARIANTS)}")
    return VARIANTS[variant]


class Evaluator:
    def __init__(self, kind: str, model: SchNet, types: np.ndarray, n_replicas: int, skin: float = 1.5,
                 chunk_size: int = 2048, quantize: str | None = None, pairs: bool = False,
                 prior: ChainPotential | None = None,
                 device: str = "cpu", dtype=torch.float32):
        if kind not in KINDS:
            raise ValueError(f"unknown implementation '{kind}'; allowed: {KINDS}")
        self.kind, self.model, self.R, self.skin = kind, model, int(n_replicas), float(skin)
        self.n = len(types)
        self.device, self.dtype = device, dtype
        self.cutoff = model.cutoff
        self.numbers = torch.from_numpy(np.tile(types, self.R).astype(np.int64)).to(device)
        self.batch = torch.repeat_interleave(torch.arange(self.R, device=device), self.n)
        if quantize and kind == "baseline":
            raise ValueError("16-bit weights are implemented in the flash kernels only")
        self.pairs = bool(pairs)
        self.flash = FlashSchNet(model, chunk_size, quantize, pairs, "paper" if kind == "flash_paper" else "recompute") \
            if kind != "baseline" else None
        self.pair_model = PairBaselineSchNet(model) if kind == "baseline" and pairs else None
        self.prior = prior
        self._ref = None
        self.edge_index, self.graph, self.rebuilds = None, None, 0

    # --- neighbour list ---------------------------------------------------------------------------
    def update_graph(self, flat: torch.Tensor, force: bool = False) -> None:
        if not force and self._ref is not None and float((flat - self._ref).norm(dim=-1).max()) <= 0.5 * self.skin:
            return
        self.edge_index = radius_graph(flat, self.batch, self.cutoff + self.skin)
        if self.pair_model is not None:
            self.pair_index, _ = unordered_pairs(self.edge_index)
        if self.flash is not None:  # radius graphs are symmetric by construction: skip the check
            self.graph = build_graph(self.edge_index, flat.shape[0], None, self.flash.chunk_size, self.flash.pairs,
                                     check_symmetric=False)
        self._ref = flat.detach().clone()
        self.rebuilds += 1

    def graph_bytes(self) -> int:
        """Persistent index structures of the current neighbour list (edge list / CSR, incl. caches)."""
        if self.flash is None:
            ei = self.pair_index if self.pair_model is not None else self.edge_index
            return ei.numel() * ei.element_size()
        total = self.graph.nbytes()
        for v in self.graph._csr.values():
            mats = [v[1], v[0]] if isinstance(v, tuple) else [v]
            for m in mats:
                if m.layout == torch.sparse_csr:
                    total += sum(t.numel() * t.element_size() for t in (m.crow_indices(), m.col_indices(), m.values()))
                else:
                    total += m.numel() * m.element_size()
        return total

    # --- model ---------------------------------------------------------------------------------------
    def model_energy_forces(self, flat: torch.Tensor):
        """SchNet energy (R,) and forces (R*N, 3) in the evaluator dtype, graph assumed current."""
        if self.flash is not None:
            return self.flash.energy_and_forces(self.numbers, flat, self.batch, n_structures=self.R, graph=self.graph)
        if self.pair_model is not None:
            e, f = self.pair_model.energy_and_forces(self.numbers, flat, self.batch, self.pair_index, None, self.R)
            return e.detach(), f.detach()
        e, f = self.model.energy_and_forces(self.numbers, flat, self.batch, self.edge_index, None, self.R,
                                            create_graph=False)
        return e.detach(), f.detach()

    def energy_forces(self, pos: torch.Tensor, with_prior: bool = True):
        """Total (prior + SchNet) energy (R,) and forces (R, N, 3), float64 in and out."""
        flat = pos.reshape(-1, 3).to(self.device, self.dtype)
        self.update_graph(flat)
        e, f = self.model_energy_forces(flat)
        e, f = e.double().cpu(), f.double().cpu().reshape(pos.shape)
        if with_prior and self.prior is not None:
            ep, fp = self.prior.energy_forces(pos, "prior")
            e, f = e + ep, f + fp
        return e, f

    def forces(self, pos):
        return self.energy_forces(pos)[1]


def tile_start(start: np.ndarray, n_replicas: int, rng: np.random.Generator, noise: float = 0.05) -> torch.Tensor:
    """R starting conformations (R, N, 3) from a pool of equilibrated ones, with a little noise."""
    idx = np.arange(n_replicas) % len(start)
    return torch.from_numpy(start[idx] + rng.normal(0, noise, (n_replicas,) + start.shape[1:]))


def peak_memory(ev: Evaluator, pos: torch.Tensor) -> dict:
    """Peak extra bytes of one SchNet energy+force evaluation (after one warm-up call that builds
    the neighbour list and the CSR caches) plus the persistent graph bytes."""
    flat = pos.reshape(-1, 3).to(ev.device, ev.dtype)
    ev.update_graph(flat, force=True)
    ev.model_energy_forces(flat)
    peak, _ = peak_bytes(lambda: ev.model_energy_forces(flat), ev.device)
    g = ev.graph_bytes()
    return {"peak_work_mb": peak / 2**20, "graph_mb": g / 2**20, "peak_mb": (peak + g) / 2**20,
            "n_edges": int(ev.edge_index.shape[1])}


def md_seconds(ev: Evaluator, pos: torch.Tensor, vel: torch.Tensor, f: torch.Tensor | None, steps: int, cfg: dict,
               gen: torch.Generator, mass: float):
    """Wall seconds of ``steps`` BAOAB Langevin steps (forces = prior + SchNet), continuing from the
    forces ``f`` at ``pos`` (None: computed first, inside the timing); returns (s, pos, vel, f)."""
    kT = KB * cfg["T"]
    sync = torch.cuda.synchronize if str(ev.device).startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    pos, vel, f = langevin_baoab(pos, vel, ev.forces, mass, cfg["dt"], cfg["gamma"], kT, steps, gen, f0=f,
                                 return_forces=True)
    sync()
    return time.perf_counter() - t0, pos, vel, f


def interleaved_rounds(evaluators: dict, start: np.ndarray, n_replicas: int, cfg: dict, system: ChainSystem,
                       seed: int, cpu: bool = False):
    """Interleaved Langevin MD timing of several evaluators on the same replicas.

    Each evaluator runs its own trajectory from the same start and the same random stream;
    ``cfg['warmup']`` untimed steps first (default 1: neighbour list, CSR caches, allocator), then
    ``repeats`` rounds of ``md_steps`` steps per evaluator, alternating evaluators within each
    round, each round exactly ``md_steps`` force calls (it continues from the forces of the
    previous one; neighbour-list rebuilds fall inside the rounds). Returns {name: [wall seconds of
    each round]}; with ``cpu``, also {name: [process CPU seconds of each round]} (one thread: the
    time the implementation itself used, insensitive to other processes on a loaded machine).
    """
    rng = np.random.default_rng(seed)
    pos0 = tile_start(start, n_replicas, rng)
    state = {}
    for name, ev in evaluators.items():
        gen = torch.Generator().manual_seed(seed)
        vel = maxwell_boltzmann(pos0.shape, system.mass, KB * cfg["T"], gen)
        _, p, v, f = md_seconds(ev, pos0.clone(), vel, None, max(1, int(cfg.get("warmup", 1))), cfg, gen,
                                system.mass)
        state[name] = (p, v, f, gen, [])
    cpu_s = {name: [] for name in evaluators}
    for _ in range(cfg["repeats"]):
        for name, ev in evaluators.items():
            p, v, f, gen, ts = state[name]
            c0 = time.process_time()
            t, p, v, f = md_seconds(ev, p, v, f, cfg["md_steps"], cfg, gen, system.mass)
            cpu_s[name].append(time.process_time() - c0)
            ts.append(t)
            state[name] = (p, v, f, gen, ts)
    wall = {name: st[-1] for name, st in state.items()}
    return (wall, cpu_s) if cpu else wall


def throughput(evaluators: dict, start: np.ndarray, n_replicas: int, cfg: dict, system: ChainSystem, seed: int) -> dict:
    """{name: steps x replicas / s} of the median round of :func:`interleaved_rounds`."""
    rounds = interleaved_rounds(evaluators, start, n_replicas, cfg, system, seed)
    return {name: cfg["md_steps"] * n_replicas / float(np.median(ts)) for name, ts in rounds.items()}


def paired_rounds(ev_a: Evaluator, ev_b: Evaluator, start: np.ndarray, n_replicas: int, cfg: dict,
                  system: ChainSystem, seed: int, clock=None) -> dict:
    """Paired timing of two evaluators (each with its own prior and neighbour lists) in one process.

    Both run their own trajectory from the same start and random stream; ``cfg['warmup']`` untimed
    steps each, then ``repeats`` rounds of ``md_steps`` steps per evaluator in ABBA order (round r
    runs A then B when r is even, B then A when odd), so neither sits first in every round. Returns
    per round the wall and process-CPU seconds of each ({'a_wall', 'b_wall', 'a_cpu', 'b_cpu'}, lists)
    and the per-round ratios b / a ('ratio_cpu', 'ratio_wall'): the speed-up of A over B in that
    round; the statistic keeps the pairing (median of the per-round ratios). ``clock``: optional
    (wall, cpu) pair of callables, for tests.
    """
    wall_clock, cpu_clock = clock if clock is not None else (time.perf_counter, time.process_time)
    rng = np.random.default_rng(seed)
    pos0 = tile_start(start, n_replicas, rng)
    kT = KB * cfg["T"]
    state = {}
    for name, ev in (("a", ev_a), ("b", ev_b)):
        gen = torch.Generator().manual_seed(seed)
        vel = maxwell_boltzmann(pos0.shape, system.mass, kT, gen)
        p, v, f = langevin_baoab(pos0.clone(), vel, ev.forces, system.mass, cfg["dt"], cfg["gamma"], kT,
                                 max(1, int(cfg.get("warmup", 1))), gen, return_forces=True)
        state[name] = [p, v, f, gen]
    out = {k: [] for k in ("a_wall", "b_wall", "a_cpu", "b_cpu")}
    evs = {"a": ev_a, "b": ev_b}
    sync = torch.cuda.synchronize if str(ev_a.device).startswith("cuda") else (lambda: None)
    for r in range(int(cfg["repeats"])):
        for name in (("a", "b") if r % 2 == 0 else ("b", "a")):
            p, v, f, gen = state[name]
            sync()
            c0, t0 = cpu_clock(), wall_clock()
            p, v, f = langevin_baoab(p, v, evs[name].forces, system.mass, cfg["dt"], cfg["gamma"], kT,
                                     int(cfg["md_steps"]), gen, f0=f, return_forces=True)
            sync()
            out[name + "_wall"].append(wall_clock() - t0)
            out[name + "_cpu"].append(cpu_clock() - c0)
            state[name] = [p, v, f, gen]
    out["ratio_cpu"] = [b / a for a, b in zip(out["a_cpu"], out["b_cpu"])]
    out["ratio_wall"] = [b / a for a, b in zip(out["a_wall"], out["b_wall"])]
    return out


def nve_run(ev: Evaluator, start: np.ndarray, cfg: dict, system: ChainSystem, seed: int) -> dict:
    """Velocity Verlet with prior + SchNet; total energy per bead vs time, drift (linear fit)."""
    rng = np.random.default_rng(seed)
    pos = tile_start(start, cfg["replicas"], rng)
    gen = torch.Generator().manual_seed(seed)
    vel = maxwell_boltzmann(pos.shape, system.mass, KB * cfg.get("T", 300.0), gen)
    _, _, totals = velocity_verlet(pos, vel, ev.energy_forces, system.mass, cfg["dt"], cfg["steps"], cfg["every"])
    e = (totals - totals[0]).numpy() / system.n          # (T, R) kcal/mol per bead
    t = np.arange(len(e)) * cfg["dt"] * cfg["every"]      # ps
    slope = np.polyfit(t, e.mean(1), 1)[0] if len(t) > 2 else float("nan")
    return {"t": t, "dE": e.mean(1), "drift": float(abs(slope)), "max_dev": float(np.abs(e).max()),
            "finite": bool(np.isfinite(e).all())}


OBSERVABLES = ("rg", "bond_mean", "bond_width", "contacts")


def chain_observables(traj: torch.Tensor, min_sep: int = 3, contact_r: float = 6.5) -> dict:
    """Per-frame observables of a trajectory (T, R, N, 3), each (T, R): radius of gyration, mean
    and width (standard deviation over the chain's bonds) of the bond lengths, and contacts: the
    mean number of non-bonded neighbours (|i - j| >= min_sep) within ``contact_r`` per bead (what
    the learned attraction shapes)."""
    rg = ((traj - traj.mean(-2, keepdim=True)) ** 2).sum(-1).mean(-1).sqrt()
    b = torch.linalg.vector_norm(traj[..., 1:, :] - traj[..., :-1, :], dim=-1)           # (T, R, N-1)
    n = traj.shape[-2]
    i = torch.arange(n)
    nonbonded = (i[:, None] - i[None, :]).abs() >= min_sep
    d = torch.cdist(traj, traj)
    contacts = ((d < contact_r) & nonbonded).sum(-1).to(traj.dtype).mean(-1)
    return {"rg": rg.numpy(), "bond_mean": b.mean(-1).numpy(), "bond_width": b.std(-1).numpy(),
            "contacts": contacts.numpy()}


def integrated_autocorr_time(x: np.ndarray, c: float = 5.0) -> float:
    """Integrated autocorrelation time (in frames) of series x (T,) or (T, R) (replicas pooled into
    one autocorrelation function): tau = 1 + 2 sum_{t=1}^{M} rho(t), with Sokal's self-consistent
    window, the smallest M >= c tau (an uncorrelated series has tau = 1)."""
    x = np.asarray(x, float)
    x = x[:, None] if x.ndim == 1 else x
    T = x.shape[0]
    x = x - x.mean(0)
    f = np.fft.rfft(x, 2 * T, axis=0)
    acov = np.fft.irfft(f * np.conj(f), axis=0)[:T].sum(1)
    if acov[0] <= 0:
        return 1.0
    rho = acov / acov[0]
    tau = 1.0
    for m in range(1, T):
        tau = 1.0 + 2.0 * float(rho[1:m + 1].sum())
        if m >= c * tau:
            break
    return tau


def summarise_observables(series: dict, frame_ps: float) -> dict:
    """Per observable: the mean over replicas of their time averages, its standard error over the
    independent replicas, the integrated autocorrelation time (ps, at least one frame) and the run
    length in autocorrelation times."""
    out = {}
    for k, x in series.items():
        per_rep = x.mean(0)
        tau = max(1.0, integrated_autocorr_time(x))
        out[k] = {"mean": float(per_rep.mean()), "sem": float(per_rep.std(ddof=1) / np.sqrt(len(per_rep))),
                  "tau_ps": tau * frame_ps, "n_tau": x.shape[0] / tau}
    return out


def observables_run(ev: Evaluator, starts: np.ndarray, cfg: dict, system: ChainSystem, seed: int) -> dict:
    """Langevin MD (prior + SchNet) of the replicas ``starts`` (R, N, 3): ``cfg['burn']`` steps
    discarded, then ``cfg['steps']`` steps with a frame every ``cfg['every']``; per-frame
    observables (:func:`chain_observables`), each (frames, R).

    The random stream depends on ``seed`` only, so two weight formats run at the same seed see the
    same starts and the same noise (common random numbers): their difference is the effect of the
    weights, not of sampling.
    """
    pos = torch.from_numpy(np.asarray(starts, dtype=np.float64))
    gen = torch.Generator().manual_seed(seed)
    kT = KB * cfg["T"]
    vel = maxwell_boltzmann(pos.shape, system.mass, kT, gen)
    if cfg.get("burn", 0):
        pos, vel = langevin_baoab(pos, vel, ev.forces, system.mass, cfg["dt"], cfg["gamma"], kT, cfg["burn"], gen)
    frames = []
    langevin_baoab(pos, vel, ev.forces, system.mass, cfg["dt"], cfg["gamma"], kT, cfg["steps"], gen,
                   every=cfg["every"], callback=lambda s, p, v: frames.append(p.clone()))
    return chain_observables(torch.stack(frames), system.min_sep, cfg.get("contact_r", 6.5))
