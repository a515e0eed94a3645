"""Prime attention: CPU time of one training step per model, as ratios against standard attention.

Why: ``prime_sep``'s separable filters F_ij = (1 + a_i)(1 + b_j) factorise, so it runs as standard
attention on rescaled queries, keys, values and output; this measures what that buys against the
broadcast form over (batch, i, j, head, channel) that prime's per-pair filters need (``sep_broadcast``:
the same separable model run through the broadcast form, the implementation before the factorised one).
The smoke configuration's sizes (8 channels, L = 96, H = 24, width 32, 4 heads, batch 64), one thread,
fused Adam, interleaved, median of REPEATS blocks of STEPS steps.

Writes benchmarks/results/prime_attention.json. ``python -m benchmarks prime_attention``.
"""
from __future__ import annotations

import time

import numpy as np
from benchmarks import save_report

REPEATS, STEPS = 5, 40


def main() -> dict:
    import torch

    from reprozoo.methods.prime_attention import model as M

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y = torch.randn(64, 96, 8), torch.randn(64, 24, 8)

    def make(prime, sep, broadcast=False):
        m = M.build(8, 96, 24, 32, 4, 1, 2.0, prime, None, norm=False, separable=sep)
        if broadcast:  # the per-pair broadcast path with the separable filters: the pre-factorised cost
            for layer in m.layers:
                layer.attn.separable = False
                layer.attn.filters = (lambda a: (lambda: ((1 + a.ak)[:, None] * (1 + a.bk)[None],
                                                          (1 + a.av)[:, None] * (1 + a.bv)[None])))(layer.attn)
        return m, torch.optim.Adam(m.parameters(), lr=1e-2, fused=True)

    runs = {"standard": make(False, False), "prime": make(True, False), "prime_sep": make(True, True),
            "sep_broadcast": make(True, True, broadcast=True)}

    def block(m, opt):
        t0 = time.process_time()
        for _ in range(STEPS):
            loss = ((m(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return (time.process_time() - t0) / STEPS

    for m, opt in runs.values():  # warm-up
        block(m, opt)
    secs = {k: [] for k in runs}
    for _ in range(REPEATS):
        for k, (m, opt) in runs.items():
            secs[k].append(block(m, opt))
    ms = {k: 1e3 * float(np.median(v)) for k, v in secs.items()}
    report = {"repeats": REPEATS, "steps": STEPS, "threads": 1, "ms_per_step": ms,
              "ratio_vs_standard": {k: v / ms["standard"] for k, v in ms.items()},
              "sep_factorised_vs_broadcast": ms["prime_sep"] / ms["sep_broadcast"]}
    print(", ".join(f"{k} {v:.2f} ms" for k, v in ms.items()),
          f"| prime_sep factorised / broadcast {report['sep_factorised_vs_broadcast']:.2f}", flush=True)
    return save_report("prime_attention", report)


if __name__ == "__main__":
    main()
