"""EMFormer's multi-scale block: one merged 5x5 depthwise convolution against the multi-branch
1x1 + 3x3 + 5x5 sum, same parameters, same run.

Contenders (``methods.emformer.model``), checked equal (outputs to 1e-5) before they are timed:

* ``single``: ``SingleConvMultiScale``: the three kernels zero-padded and summed into one 5x5 kernel
  on every call (the merge is inside the timed call), one circular-padded depthwise convolution;
* ``multibranch``: ``MultiBranchConv``: three circular-padded depthwise convolutions, outputs summed.

Workloads: the block as the miniature uses it (qkv aggregation, 3*16 channels on the 8x16 token grid,
batch 8), wider blocks on the same grid, and the paper-like token grid (32x64 tokens of a
128x256 ERA5 field at patch 4, 192 channels, batch 1). Forward (inference) and forward+backward
(training) per call, best of REPEATS interleaved rounds (``method.block_speed``; the machine is
shared: the minimum is the least noisy), each ~TARGET_S; ratio = multi-branch time / single time
(> 1: the single convolution is faster). Also the whole forecaster's training step (EMFormerNet of the
smoke size, both block kinds). One thread.

Writes benchmarks/results/emformer.json. ``python -m benchmarks emformer``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

REPEATS = 5
TARGET_S = 0.1
WORKLOADS = [  # (name, channels, h, w, batch)
    ("miniature qkv block: 48 ch, 8x16 tokens, batch 8", 48, 8, 16, 8),
    ("miniature mlp block: 16 ch, 8x16 tokens, batch 8", 16, 8, 16, 8),
    ("wider: 192 ch, 8x16 tokens, batch 8", 192, 8, 16, 8),
    ("paper-like grid: 192 ch, 32x64 tokens, batch 1", 192, 32, 64, 1),
]


def _agree(channels: int) -> bool:
    import torch

    from reprozoo.methods.emformer.model import MultiBranchConv, SingleConvMultiScale

    a, b = MultiBranchConv(channels), SingleConvMultiScale(channels)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, channels, 8, 16)
    with torch.no_grad():
        return bool(torch.allclose(a(x), b(x), atol=1e-5))


def _model_step_ms() -> dict:
    import torch

    from reprozoo.methods.emformer.model import EMFormerNet

    out = {}
    x = torch.randn(8, 2, 32, 64)
    for kind in ("single", "multibranch"):
        torch.manual_seed(0)
        net = EMFormerNet(dim=16, depth=2, heads=2, patch=4, kind=kind)
        best = float("inf")
        for _ in range(REPEATS):
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < TARGET_S:
                net.zero_grad()
                net(x)[0].pow(2).mean().backward()
                n += 1
            best = min(best, (time.perf_counter() - t0) / n)
        out[kind] = 1e3 * best
    out["ratio"] = out["multibranch"] / out["single"]
    return out


def main() -> dict:
    import torch

    from reprozoo.methods.emformer.method import block_speed

    torch.set_num_threads(1)
    report = {"repeats": REPEATS, "target_s": TARGET_S, "threads": 1, "results": {}}
    for name, c, h, w, b in WORKLOADS:
        row = {"channels": c, "h": h, "w": w, "batch": b, "agree": _agree(c)}
        row.update(block_speed(c, h, w, b, REPEATS, TARGET_S))
        report["results"][name] = row
        print(f"{name}: single fwd {row['single_fwd_ms']:.3f} ms, fwd+bwd {row['single_fwdbwd_ms']:.3f} ms; "
              f"multi-branch / single: fwd x{row['speedup_fwd']:.2f}, fwd+bwd x{row['speedup_fwdbwd']:.2f}"
              + ("" if row["agree"] else " (OUTPUTS DIFFER)"), flush=True)
    m = _model_step_ms()
    report["model_train_step_ms"] = m
    print(f"EMFormerNet training step (smoke size, batch 8): single {m['single']:.1f} ms, "
          f"multi-branch {m['multibranch']:.1f} ms, ratio x{m['ratio']:.2f}", flush=True)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "emformer.json").write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
