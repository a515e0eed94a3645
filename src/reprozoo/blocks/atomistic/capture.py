"""Per-layer input/output capture with forward hooks.

A generic helper added for layer-wise model merging (gffmerge); usable by any method that needs
the activations entering and leaving named submodules (distillation, probing, merging).

``record_io(model, names)`` is a context manager: every forward call of a submodule named in
``names`` (names as in ``model.named_modules()``, e.g. ``"interactions.0.filter1"``) appends its
first positional input and its output (detached) to ``rec.inputs[name]`` / ``rec.outputs[name]``.
``rec.input(name)`` / ``rec.output(name)`` concatenate the calls along dim 0; ``rec.clear()``.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict


class IORecord:
    def __init__(self):
        self.inputs: dict[str, list] = defaultdict(list)
        self.outputs: dict[str, list] = defaultdict(list)

    def input(self, name: str):
        import torch

        return torch.cat(self.inputs[name], dim=0)

    def output(self, name: str):
        import torch

        return torch.cat(self.outputs[name], dim=0)

    def clear(self) -> None:
        self.inputs.clear()
        self.outputs.clear()


@contextlib.contextmanager
def record_io(model, names, detach: bool = True):
    """Record the first positional input and the output of the named submodules while active."""
    modules = dict(model.named_modules())
    missing = [n for n in names if n not in modules]
    if missing:
        raise KeyError(f"no submodules {missing} in {type(model).__name__}")
    rec = IORecord()
    handles = []

    def make_hook(name):
        def hook(module, args, output):
            x = args[0] if args else None
            if detach:
                x = x.detach() if x is not None else None
                output = output.detach()
            rec.inputs[name].append(x)
            rec.outputs[name].append(output)
        return hook

    try:
        for n in names:
            handles.append(modules[n].register_forward_hook(make_hook(n)))
        yield rec
    finally:
        for h in handles:
            h.remove()
