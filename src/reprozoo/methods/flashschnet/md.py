"""Force evaluators (baseline vs flash, same weights) for replicas of a chain, MD benchmarks.

``Evaluator(kind, model, types, n_replicas, ...)`` evaluates prior + SchNet energy and forces on
positions (R, N, 3) with a Verlet neighbour list (cutoff + skin, rebuilt when a bead moved more
than skin / 2; pairs beyond the cutoff get a zero envelope, so results do not depend on the skin).
``kind``: 'baseline' (blocks.atomistic.SchNet, (E, F) tensors + index_add_) or 'flash'
(:class:`FlashSchNet`, optionally with 16-bit weights). Both share one ``SchNet`` instance.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ...blocks.atomistic import SchNet, radius_graph
from .cgchain import ChainPotential, ChainSystem, langevin_baoab, maxwell_boltzmann, velocity_verlet, KB
from .flash import FlashSchNet, build_graph
from .measure import peak_bytes

KINDS = ("baseline", "flash")


def variant_kind(variant: str) -> tuple[str, str | None]:
    """variant id -> (kind, quantize)."""
    if variant.startswith("baseline"):
        return "baseline", None
    if variant == "flash":
        return "flash", None
    if variant.startswith("flash_fp16"):
        return "flash", "float16"
    if variant.startswith("flash_bf16"):
        return "flash", "bfloat16"
    if variant.startswith("flash_int16"):
        return "flash", "int16"
    raise ValueError(f"unknown flashschnet variant '{variant}'")


class Evaluator:
    def __init__(self, kind: str, model: SchNet, types: np.ndarray, n_replicas: int, skin: float = 1.5,
                 chunk_size: int = 2048, quantize: str | None = None, pairs: bool = True, prior: ChainPotential | None = None,
                 device: str = "cpu", dtype=torch.float32):
        if kind not in KINDS:
            raise ValueError(f"unknown implementation '{kind}'; allowed: {KINDS}")
        self.kind, self.model, self.R, self.skin = kind, model, int(n_replicas), float(skin)
        self.n = len(types)
        self.device, self.dtype = device, dtype
        self.cutoff = model.cutoff
        self.numbers = torch.from_numpy(np.tile(types, self.R).astype(np.int64)).to(device)
        self.batch = torch.repeat_interleave(torch.arange(self.R, device=device), self.n)
        self.flash = FlashSchNet(model, chunk_size, quantize, pairs) if kind == "flash" else None
        self.prior = prior
        self._ref = None
        self.edge_index, self.graph, self.rebuilds = None, None, 0

    # --- neighbour list ---------------------------------------------------------------------------
    def update_graph(self, flat: torch.Tensor, force: bool = False) -> None:
        if not force and self._ref is not None and float((flat - self._ref).norm(dim=-1).max()) <= 0.5 * self.skin:
            return
        self.edge_index = radius_graph(flat, self.batch, self.cutoff + self.skin)
        if self.flash is not None:  # radius graphs are symmetric by construction: skip the check
            self.graph = build_graph(self.edge_index, flat.shape[0], None, self.flash.chunk_size, self.flash.pairs,
                                     check_symmetric=False)
        self._ref = flat.detach().clone()
        self.rebuilds += 1

    def graph_bytes(self) -> int:
        """Persistent index structures of the current neighbour list (edge list / CSR, incl. caches)."""
        if self.flash is None:
            return self.edge_index.numel() * self.edge_index.element_size()
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


def md_seconds(ev: Evaluator, pos: torch.Tensor, vel: torch.Tensor, steps: int, cfg: dict, gen: torch.Generator,
               mass: float):
    """Wall seconds of ``steps`` BAOAB Langevin steps (forces = prior + SchNet); returns (s, pos, vel)."""
    kT = KB * cfg["T"]
    sync = torch.cuda.synchronize if str(ev.device).startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    pos, vel = langevin_baoab(pos, vel, ev.forces, mass, cfg["dt"], cfg["gamma"], kT, steps, gen)
    sync()
    return time.perf_counter() - t0, pos, vel


def throughput(evaluators: dict, start: np.ndarray, n_replicas: int, cfg: dict, system: ChainSystem, seed: int) -> dict:
    """Interleaved Langevin MD timing of several evaluators on the same replicas.

    Each evaluator runs its own trajectory from the same start and the same random stream; one
    warm-up step, then ``repeats`` rounds of ``md_steps`` steps per evaluator, alternating, and the
    median round is kept. Returns {name: steps x replicas / s}.
    """
    rng = np.random.default_rng(seed)
    pos0 = tile_start(start, n_replicas, rng)
    state = {}
    for name, ev in evaluators.items():
        gen = torch.Generator().manual_seed(seed)
        vel = maxwell_boltzmann(pos0.shape, system.mass, KB * cfg["T"], gen)
        _, p, v = md_seconds(ev, pos0.clone(), vel, 1, cfg, gen, system.mass)  # warm-up (lists, caches)
        state[name] = (p, v, gen, [])
    for _ in range(cfg["repeats"]):
        for name, ev in evaluators.items():
            p, v, gen, ts = state[name]
            t, p, v = md_seconds(ev, p, v, cfg["md_steps"], cfg, gen, system.mass)
            ts.append(t)
            state[name] = (p, v, gen, ts)
    out = {}
    for name, (_, _, _, ts) in state.items():
        t = float(np.median(ts))
        out[name] = cfg["md_steps"] * n_replicas / t
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
