"""What a method's code sees: :class:`RunContext` in, :class:`Metrics` out.

A method folder's ``method.py`` implements::

    def train_shared(ctx: RunContext) -> None        # optional, spec ``train_shared: true``:
        ...                                          # per-seed work every variant reuses, into ctx.shared_dir
    def train(ctx: RunContext) -> None               # one variant, one seed: record into ctx.metrics
        ...
    def plot(table: pd.DataFrame, plots_dir: Path, params: dict) -> None   # optional, method-specific figures

Scalars and curves recorded in ``ctx.metrics`` become ``metrics.json``, the long table
``metrics.parquet`` (method, variant, seed, metric, x, value), MLflow metrics and the inputs of
claim expressions.
"""
from __future__ import annotations

import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np


UNIT_SUFFIX = "#unit"  # long-table rows of per-unit values: metric "<name>#unit", x = unit index


@dataclass
class Metrics:
    scalars: dict[str, float] = field(default_factory=dict)
    curves: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    unit_values: dict[str, list[float]] = field(default_factory=dict)

    def scalar(self, name: str, value: float) -> None:
        self.scalars[name] = float(value)

    def units(self, name: str, values: Sequence[float]) -> None:
        """One value per test unit (item, observation, subject, search), in a fixed unit order
        shared by every variant of the seed: claims on ``name`` then take their interval from a
        seed-and-unit bootstrap paired across variants. Records the scalar ``name`` (the mean) too."""
        vals = [float(v) for v in values]
        if not vals:
            raise ValueError(f"units '{name}': no values")
        self.unit_values[name] = vals
        self.scalars[name] = float(np.mean(vals))

    def curve(self, name: str, xs: Sequence[float], ys: Sequence[float]) -> None:
        xs, ys = [float(x) for x in xs], [float(y) for y in ys]
        if len(xs) != len(ys):
            raise ValueError(f"curve '{name}': {len(xs)} x values but {len(ys)} y values")
        self.curves[name] = (xs, ys)

    def to_json(self) -> dict:
        out = {"scalars": self.scalars,
               "curves": {k: {"x": xs, "y": ys} for k, (xs, ys) in self.curves.items()}}
        if self.unit_values:
            out["units"] = self.unit_values
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Metrics":
        m = cls(dict(data.get("scalars", {})))
        for k, c in data.get("curves", {}).items():
            m.curves[k] = (c["x"], c["y"])
        m.unit_values = {k: list(v) for k, v in data.get("units", {}).items()}
        return m

    def rows(self) -> list[dict[str, Any]]:
        rows = [{"metric": k, "x": float("nan"), "value": v} for k, v in self.scalars.items()]
        for k, (xs, ys) in self.curves.items():
            rows += [{"metric": k, "x": x, "value": y} for x, y in zip(xs, ys)]
        for k, vals in self.unit_values.items():
            rows += [{"metric": k + UNIT_SUFFIX, "x": float(i), "value": v} for i, v in enumerate(vals)]
        return rows


@dataclass
class RunContext:
    method: str
    variant: str
    seed: int
    scale: str
    params: dict[str, Any]
    data: dict[str, Path]
    outdir: Path
    shared_dir: Path | None = None
    threads: int = 1
    metrics: Metrics = field(default_factory=Metrics)
    _t0: float = field(default_factory=time.perf_counter)

    def progress(self, msg: str) -> None:
        """Progress for long work; lands in the job's log file."""
        print(f"[{self.method}/{self.variant}/seed{self.seed} {time.perf_counter() - self._t0:7.1f}s] {msg}",
              flush=True)

    def rng(self, offset: int = 0) -> np.random.Generator:
        return np.random.default_rng(self.seed * 1_000_003 + offset)


def seed_everything(seed: int, threads: int = 1) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))
    if "torch" in sys.modules:  # seed torch only where the method's code imported it
        import torch

        torch.manual_seed(seed)
        torch.set_num_threads(max(1, threads))
        # CPU kernels used here are deterministic for a fixed thread count; use_deterministic_algorithms
        # would import torch._dynamo (~3 s per job) for nothing on CPU


