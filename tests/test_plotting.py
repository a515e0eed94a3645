"""Generic plots: declared axis labels, only the declared curves."""
def test_generic_curves_declared_as_a_dict_get_their_axis_labels(tmp_path, monkeypatch):
    import pandas as pd

    from reprozoo import plotting

    seen = {}
    real = plotting.curve_plot
    monkeypatch.setattr(plotting, "curve_plot", lambda t, m, out, **kw: seen.setdefault(m, kw) and real(t, m, out, **kw))
    table = pd.DataFrame({"method": "m", "variant": "a", "seed": 0, "scale": "ci",
                          "metric": ["val_loss"] * 3 + ["raw"] * 3, "x": [0, 1, 2] * 2, "value": [3.0, 2, 1] * 2})
    plotting.generic_plots(table, tmp_path, None, {"val_loss": ("training step", "validation MSE")})
    assert seen == {"val_loss": {"logy": False, "xlabel": "training step", "ylabel": "validation MSE"}}
    assert (tmp_path / "curve_val_loss.png").exists() and not (tmp_path / "curve_raw.png").exists()
