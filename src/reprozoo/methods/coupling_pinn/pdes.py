"""The four test problems, their PINN residuals and reference solutions.

Every problem is 1-D in space (Burgers and Allen-Cahn add time), with the boundary / initial
condition imposed exactly by an output transform (DeepXDE's ``apply_output_transform``), so the loss
is the mean squared PDE residual alone and no loss weights differ between architectures.

- ``poisson``:   -u'' = f on [0, 1], u(0) = u(1) = 0, manufactured u = sin(2 pi x) + a sin(m pi x)
                 (two scales; smoke: a = 0.1, m = 4); ansatz u = x (1 - x) N(2x - 1).
- ``helmholtz``: u'' + k^2 u = f on [0, 1], u(0) = u(1) = 0, manufactured u = sin(m pi x); smoke:
                 k = 6, m = 4, the challenging case: the solution has two periods on [0, 1] and the
                 operator is indefinite (k^2 = 36 lies between the Dirichlet eigenvalues pi^2 and
                 4 pi^2) and nearly singular on sin(2 pi x) (|k^2 - 4 pi^2| = 3.5 against 122 on the
                 solution's own mode), so the residual hardly penalises an error in that mode.
                 Same ansatz.
- ``burgers``:   u_t + u u_x = nu u_xx on [0, 2 pi) periodic, u(x, 0) = -sin(x); features
                 (cos x, sin x, t) make u periodic by construction, ansatz u = u0(x) + (t / T) N.
                 Reference: the exact Cole-Hopf solution, ``reprozoo.data.pde.burgers.cole_hopf``.
- ``allen_cahn``: u_t = eps^2 u_xx + u - u^3 on [0, 2 pi) periodic, u(x, 0) = a sin(x) + b sin(3x);
                 same features and ansatz. Reference: the project's stabilised semi-implicit spectral
                 solver ``reprozoo.data.pde.allen_cahn.AllenCahn`` (1-D).

Two routes to the residual, which the tests hold equal:

- ``residual_jet``: from the trunk's Taylor-mode output jet (networks.PINNTrunk.jet), the chain and
  product rules applied by hand to the features and the ansatz (the route training takes);
- ``residual``: from any function u(X) by ``torch.autograd.grad(..., create_graph=True)``.

Coordinates are arrays X (N, d) with columns (x) or (x, t). A feature jet is (J, N, n_features):
value, first derivatives along the ``n_dirs`` coordinates, second derivative along x.
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


def _t(X) -> torch.Tensor:
    return X if isinstance(X, torch.Tensor) else torch.as_tensor(np.asarray(X), dtype=torch.get_default_dtype())


class Problem:
    name = ""
    dim = 1            # coordinates per point
    n_features = 1     # network input width
    n_dirs = 1         # first-derivative directions the residual needs (x, or x and t)
    profile_col = 0    # the coordinate (x) along which derivative profiles are taken

    def features(self, X: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def feature_jet(self, X) -> torch.Tensor:
        raise NotImplementedError

    def ansatz(self, X: torch.Tensor, net_out: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def u(self, model, X) -> torch.Tensor:
        """Values (K, N) of every member of the trunk ``model`` at X (N, d)."""
        X = _t(X)
        return self.ansatz(X, model(self.features(X)))[..., 0]

    def residual_jet(self, X, out) -> torch.Tensor:
        """Residual (K, N) from the trunk's output jet ``out`` (J, K, N, 1) at X (N, d)."""
        raise NotImplementedError

    def residual(self, u_fn, X: torch.Tensor) -> torch.Tensor:
        """Residual (N, 1) of u = u_fn(X) (N, 1) by autograd; X must require grad."""
        raise NotImplementedError

    def collocation(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError

    def reference(self) -> tuple[np.ndarray, np.ndarray]:
        """(X_eval (M, d), u_ref (M,)) on the evaluation grid."""
        raise NotImplementedError

    def exact_at(self, X: np.ndarray) -> np.ndarray | None:
        """The solution at arbitrary points, where it is known in closed form (else None)."""
        return None


class Steady1D(Problem):
    """Dirichlet problems on [0, 1] with the hard ansatz u = g(x) N(2x - 1), g = x (1 - x)."""

    def __init__(self, n_eval: int = 512):
        self.n_eval = int(n_eval)

    def features(self, X):
        return 2.0 * X - 1.0

    def feature_jet(self, X):
        X = _t(X)
        return torch.stack([2.0 * X - 1.0, torch.full_like(X, 2.0), torch.zeros_like(X)])

    def ansatz(self, X, net_out):
        return X * (1.0 - X) * net_out

    def _u_jet(self, X, out):
        """(u, u_x, u_xx), each (K, N, 1), by the product rule on g N."""
        X = _t(X)
        g, g1 = X * (1.0 - X), 1.0 - 2.0 * X
        n, n1, n2 = out[0], out[1], out[2]
        return g * n, g1 * n + g * n1, -2.0 * n + 2.0 * g1 * n1 + g * n2

    def collocation(self, rng, n):
        return np.sort(rng.uniform(0.0, 1.0, size=(n, 1)), axis=0)

    def exact(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def exact_at(self, X):
        return self.exact(np.asarray(X)[:, 0])

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

    def residual_jet(self, X, out):
        X = _t(X)
        _, _, uxx = self._u_jet(X, out)
        return (-uxx - self.source(X))[..., 0]

    def residual(self, u_fn, X):
        uxx = d_dx(d_dx(u_fn(X), X), X)
        return -uxx - self.source(X)


class Helmholtz1D(Steady1D):
    name = "helmholtz"

    def __init__(self, k: float = 6.0, m: int = 4, n_eval: int = 512):
        super().__init__(n_eval)
        self.k, self.m = float(k), int(m)

    def exact(self, x):
        return np.sin(self.m * np.pi * x)

    def source(self, X):
        """f = u'' + k^2 u of the manufactured solution."""
        return (self.k ** 2 - (self.m * math.pi) ** 2) * torch.sin(self.m * math.pi * X)

    def residual_jet(self, X, out):
        X = _t(X)
        u, _, uxx = self._u_jet(X, out)
        return (uxx + self.k ** 2 * u - self.source(X))[..., 0]

    def residual(self, u_fn, X):
        u = u_fn(X)
        uxx = d_dx(d_dx(u, X), X)
        return uxx + self.k ** 2 * u - self.source(X)


class PeriodicEvolution(Problem):
    """u(x, t) on [0, 2 pi) x [0, T], periodic in x, initial condition imposed exactly."""

    dim, n_features, n_dirs = 2, 3, 2
    length = 2 * np.pi

    def __init__(self, t_end: float, n_ref: int = 256, n_eval_t: int = 21):
        self.t_end, self.n_ref, self.n_eval_t = float(t_end), int(n_ref), int(n_eval_t)

    def u0_np(self, x):
        raise NotImplementedError

    def u0(self, x):
        """(u0, u0', u0'') at x (torch)."""
        raise NotImplementedError

    def features(self, X):
        x, t = X[:, :1], X[:, 1:2]
        return torch.cat([torch.cos(x), torch.sin(x), 2.0 * t / self.t_end - 1.0], dim=1)

    def feature_jet(self, X):
        X = _t(X)
        x = X[:, :1]
        c, s, z = torch.cos(x), torch.sin(x), torch.zeros_like(x)
        return torch.stack([self.features(X),
                            torch.cat([-s, c, z], 1),                                    # d/dx
                            torch.cat([z, z, torch.full_like(x, 2.0 / self.t_end)], 1),  # d/dt
                            torch.cat([-c, -s, z], 1)])                                  # d2/dx2

    def ansatz(self, X, net_out):
        return self.u0(X[:, :1])[0] + (X[:, 1:2] / self.t_end) * net_out

    def _u_jet(self, X, out):
        """(u, u_x, u_t, u_xx), each (K, N, 1)."""
        X = _t(X)
        f0, f1, f2 = self.u0(X[:, :1])
        tau = X[:, 1:2] / self.t_end
        n, nx, nt, nxx = out[0], out[1], out[2], out[3]
        return f0 + tau * n, f1 + tau * nx, n / self.t_end + tau * nt, f2 + tau * nxx

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
        return -torch.sin(x), -torch.cos(x), torch.sin(x)

    def residual_jet(self, X, out):
        u, ux, ut, uxx = self._u_jet(X, out)
        return (ut + u * ux - self.nu * uxx)[..., 0]

    def residual(self, u_fn, X):
        u = u_fn(X)
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
        return (self.a * torch.sin(x) + self.b * torch.sin(3 * x),
                self.a * torch.cos(x) + 3 * self.b * torch.cos(3 * x),
                -self.a * torch.sin(x) - 9 * self.b * torch.sin(3 * x))

    def residual_jet(self, X, out):
        u, ux, ut, uxx = self._u_jet(X, out)
        return (ut - self.eps ** 2 * uxx - u + u ** 3)[..., 0]

    def residual(self, u_fn, X):
        u = u_fn(X)
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
