"""The four test problems, their PINN residuals (autograd) and reference solutions.

Every problem is 1-D in space (Burgers and Allen-Cahn add time), with the boundary / initial
condition imposed exactly by an output transform (DeepXDE's ``apply_output_transform``), so the loss
is the mean squared PDE residual alone and no loss weights differ between architectures.

- ``poisson``:   -u'' = f on [0, 1], u(0) = u(1) = 0, manufactured u = sin(2 pi x) + a sin(m pi x) (smoke: a = 0.1, m = 4)
                 (two scales); ansatz u = x (1 - x) N(x).
- ``helmholtz``: u'' + k^2 u = f on [0, 1], u(0) = u(1) = 0, manufactured u = sin(m pi x) (smoke: k = 2 < pi, m = 2: a definite operator; k = 6, m = 4 did not train for any trunk in 800 steps);
                 ansatz u = x (1 - x) N(x).
- ``burgers``:   u_t + u u_x = nu u_xx on [0, 2 pi) periodic, u(x, 0) = -sin(x); features
                 (cos x, sin x, t) make u periodic by construction, ansatz u = u0(x) + (t / T) N.
                 Reference: the exact Cole-Hopf solution, ``reprozoo.data.pde.burgers.cole_hopf``.
- ``allen_cahn``: u_t = eps^2 u_xx + u - u^3 on [0, 2 pi) periodic, u(x, 0) = a sin(x) + b sin(3x);
                 same features and ansatz. Reference: the project's stabilised semi-implicit spectral
                 solver ``reprozoo.data.pde.allen_cahn.AllenCahn`` (1-D).

Coordinates are tensors X (N, d) with columns (x) or (x, t); derivatives come from
``torch.autograd.grad(..., create_graph=True)`` so the residual can be differentiated again by the
optimiser.
"""
from __future__ import annotations

import math

import numpy as np
import torch

PDES = ("poisson", "helmholtz", "burgers", "allen_cahn")


def d_dx(u: torch.Tensor, X: torch.Tensor, col: int = 0) -> torch.Tensor:
    """du/dX[:, col] per point (u: (N, 1) or (N,), each row depends on its own row of X only)."""
    g, = torch.autograd.grad(u.sum(), X, create_graph=True)
    return g[:, col:col + 1]


class Problem:
    name = ""
    dim = 1            # coordinates per point
    n_features = 1     # network input width
    profile_col = 0    # the coordinate (x) along which derivative profiles are taken

    def features(self, X):
        raise NotImplementedError

    def ansatz(self, X, net_out):
        raise NotImplementedError

    def u(self, model, X):
        return self.ansatz(X, model(self.features(X)))

    def residual(self, model, X):
        raise NotImplementedError

    def collocation(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError

    def reference(self) -> tuple[np.ndarray, np.ndarray]:
        """(X_eval (M, d), u_ref (M,)) on the evaluation grid."""
        raise NotImplementedError


class Steady1D(Problem):
    """Dirichlet problems on [0, 1] with the hard ansatz u = x (1 - x) N(2x - 1)."""

    def __init__(self, n_eval: int = 512):
        self.n_eval = int(n_eval)

    def features(self, X):
        return 2.0 * X - 1.0

    def ansatz(self, X, net_out):
        return X * (1.0 - X) * net_out

    def collocation(self, rng, n):
        return np.sort(rng.uniform(0.0, 1.0, size=(n, 1)), axis=0)

    def exact(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def reference(self):
        x = np.linspace(0.0, 1.0, self.n_eval)[:, None]
        return x, self.exact(x[:, 0])


class Poisson1D(Steady1D):
    name = "poisson"

    def __init__(self, amp2: float = 0.1, m2: int = 4, n_eval: int = 512):
        super().__init__(n_eval)
        self.amp2, self.m2 = float(amp2), int(m2)

    def exact(self, x):
        return np.sin(2 * np.pi * x) + self.amp2 * np.sin(self.m2 * np.pi * x)

    def source(self, X):
        """f = -u'' of the manufactured solution."""
        return ((2 * math.pi) ** 2 * torch.sin(2 * math.pi * X)
                + self.amp2 * (self.m2 * math.pi) ** 2 * torch.sin(self.m2 * math.pi * X))

    def residual(self, model, X):
        u = self.u(model, X)
        uxx = d_dx(d_dx(u, X), X)
        return -uxx - self.source(X)


class Helmholtz1D(Steady1D):
    name = "helmholtz"

    def __init__(self, k: float = 2.0, m: int = 2, n_eval: int = 512):
        super().__init__(n_eval)
        self.k, self.m = float(k), int(m)

    def exact(self, x):
        return np.sin(self.m * np.pi * x)

    def source(self, X):
        """f = u'' + k^2 u of the manufactured solution."""
        return (self.k ** 2 - (self.m * math.pi) ** 2) * torch.sin(self.m * math.pi * X)

    def residual(self, model, X):
        u = self.u(model, X)
        uxx = d_dx(d_dx(u, X), X)
        return uxx + self.k ** 2 * u - self.source(X)


class PeriodicEvolution(Problem):
    """u(x, t) on [0, 2 pi) x [0, T], periodic in x, initial condition imposed exactly."""

    dim, n_features = 2, 3
    length = 2 * np.pi

    def __init__(self, t_end: float, n_ref: int = 256, n_eval_t: int = 21):
        self.t_end, self.n_ref, self.n_eval_t = float(t_end), int(n_ref), int(n_eval_t)

    def u0_np(self, x):
        raise NotImplementedError

    def u0(self, x):
        raise NotImplementedError

    def features(self, X):
        x, t = X[:, :1], X[:, 1:2]
        return torch.cat([torch.cos(x), torch.sin(x), 2.0 * t / self.t_end - 1.0], dim=1)

    def ansatz(self, X, net_out):
        return self.u0(X[:, :1]) + (X[:, 1:2] / self.t_end) * net_out

    def collocation(self, rng, n):
        return np.column_stack([rng.uniform(0, self.length, n), rng.uniform(0, self.t_end, n)])

    def reference_grid(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x (n_ref,), t (n_eval_t,), u (n_eval_t, n_ref)) from the project's solvers."""
        raise NotImplementedError

    def reference(self):
        x, t, u = self.reference_grid()
        tt, xx = np.meshgrid(t, x, indexing="ij")
        return np.column_stack([xx.ravel(), tt.ravel()]), u.ravel()


class Burgers1D(PeriodicEvolution):
    name = "burgers"

    def __init__(self, nu: float = 0.05, t_end: float = 1.0, n_ref: int = 256, n_eval_t: int = 21):
        super().__init__(t_end, n_ref, n_eval_t)
        self.nu = float(nu)

    def u0_np(self, x):
        return -np.sin(x)

    def u0(self, x):
        return -torch.sin(x)

    def residual(self, model, X):
        u = self.u(model, X)
        g, = torch.autograd.grad(u.sum(), X, create_graph=True)
        ux, ut = g[:, :1], g[:, 1:2]
        uxx = d_dx(ux, X, 0)
        return ut + u * ux - self.nu * uxx

    def reference_grid(self):
        from reprozoo.data.pde.burgers import cole_hopf

        x = np.arange(self.n_ref) * self.length / self.n_ref
        t = np.linspace(0.0, self.t_end, self.n_eval_t)
        return x, t, cole_hopf(self.u0_np(x), t, self.nu, self.length)


class AllenCahn1D(PeriodicEvolution):
    name = "allen_cahn"

    def __init__(self, eps: float = 0.1, t_end: float = 2.0, a: float = 0.5, b: float = 0.3,
                 dt_ref: float = 1e-3, n_ref: int = 256, n_eval_t: int = 21):
        super().__init__(t_end, n_ref, n_eval_t)
        self.eps, self.a, self.b, self.dt_ref = float(eps), float(a), float(b), float(dt_ref)

    def u0_np(self, x):
        return self.a * np.sin(x) + self.b * np.sin(3 * x)

    def u0(self, x):
        return self.a * torch.sin(x) + self.b * torch.sin(3 * x)

    def residual(self, model, X):
        u = self.u(model, X)
        g, = torch.autograd.grad(u.sum(), X, create_graph=True)
        ux, ut = g[:, :1], g[:, 1:2]
        uxx = d_dx(ux, X, 0)
        return ut - self.eps ** 2 * uxx - u + u ** 3

    def reference_grid(self):
        from reprozoo.data.pde.allen_cahn import AllenCahn

        solver = AllenCahn(self.n_ref, ndim=1, length=self.length, eps=self.eps)
        t = np.linspace(0.0, self.t_end, self.n_eval_t)
        u, _ = solver.run(self.u0_np(solver.x)[None], t, self.dt_ref)
        return solver.x, t, u[0]


def make_problem(name: str, cfg: dict | None = None) -> Problem:
    cfg = dict(cfg or {})
    classes = {"poisson": Poisson1D, "helmholtz": Helmholtz1D, "burgers": Burgers1D, "allen_cahn": AllenCahn1D}
    if name not in classes:
        raise ValueError(f"unknown PDE '{name}'; choose one of {PDES}")
    return classes[name](**cfg)
