"""How every figure of the project is finished: tight layout, written, closed.

Kept apart from ``plotting`` (which imports pandas) so that a method's module can import it at
the top without adding to its job's start-up.
"""
from __future__ import annotations


def save_figure(fig, path, *args, **kwargs) -> None:
    """``fig.tight_layout()``, ``fig.savefig(path, *args, **kwargs)``, then close it (frees memory
    in long plot loops)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, *args, **kwargs)
    plt.close(fig)
