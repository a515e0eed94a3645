"""Probes behind two numbers of the configs and the page (run by hand, not by the pipeline).

``python -m reprozoo.methods.eeg_hallucination.probes snr [BACKGROUND_UV ...]``
    Per seed (0-2; the head model drawn as ``numpy.random.default_rng(seed)``, the planted study with
    ``default_rng(100 + seed)``), the subject-level effect size d_z (mean / s.d. over the 27 subjects)
    of detected - correct in Table 1's two signature cells (central ROI, 280-550 and 550-750 ms) at
    each background level (default 5 and 10 uV); smoke settings otherwise. It set
    ``lowsnr_background_uv`` (cold review 6, D1).
``python -m reprozoo.methods.eeg_hallucination.probes calib``
    The noise-free central-ROI difference at 600-750 ms (Figure 2's window, the effect_uv calibration)
    and at 550-750 ms (Table 1's window, the smoke metric ``anova_central_p600_uv``), as
    tests/test_eeg_hallucination.py::test_effect_size_is_calibrated_to_the_papers_figure_2 draws it.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np


def _cfg() -> dict:
    import yaml

    return yaml.safe_load((Path(__file__).parent / "configs" / "smoke.yaml").read_text())


def snr(levels=(5.0, 10.0), seeds=(0, 1, 2)) -> list[dict]:
    from reprozoo.data.eeg.simulate import TEN_TWENTY, head_model

    from . import erp_stats, study
    from .method import _study_params

    cfg = _cfg()
    p = _study_params(cfg)
    rows = []
    for seed in seeds:
        head = head_model(list(TEN_TWENTY), study.PLANTED, p["n_subjects"], np.random.default_rng(seed))
        for bg in levels:
            t0 = time.process_time()
            d = study.simulate_study({**p, "background_uv": bg}, np.random.default_rng(100 + seed), head=head,
                                     effect=True)
            y, cells = erp_stats.window_means(d["evoked"], d["times"], d["ch_names"], cfg["anova_rois"],
                                              cfg["anova_windows_ms"])
            row = {"seed": seed, "background_uv": bg}
            for tag, w in (("n400", (280.0, 550.0)), ("p600", (550.0, 750.0))):
                dd = y[cells.index(("central", w))][:, 1] - y[cells.index(("central", w))][:, 0]
                row[f"{tag}_uv"], row[f"{tag}_sd"] = float(dd.mean()), float(dd.std(ddof=1))
                row[f"{tag}_dz"] = row[f"{tag}_uv"] / row[f"{tag}_sd"]
            row["cpu_s"] = time.process_time() - t0
            rows.append(row)
            print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    return rows


def calib() -> list[list[float]]:
    from reprozoo.data.eeg.simulate import TEN_TWENTY, head_model

    from . import erp_stats, study

    c = _cfg()
    p = {k: c[k] for k in ("sfreq", "soa_s", "subj_lat_sd_ms", "trial_lat_sd_ms", "n400_ms", "p600_ms",
                           "l_freq", "h_freq", "tmin", "tmax", "reject_uv", "miss_rate", "soa_jitter_s")}
    p.update(n_subjects=8, n_trials=c["n_trials"], effect_uv=c["effect_uv"], effect_sd_uv=0.0, background_uv=0.0,
             white_uv=0.0, drift_uv=0.0, blink_rate=0.0)
    out = []
    for seed in range(2):
        rng = np.random.default_rng(100 + seed)
        head = head_model(list(TEN_TWENTY), study.PLANTED, p["n_subjects"], rng)
        d = study.simulate_study(p, rng, head=head, effect=True)
        y, _ = erp_stats.window_means(d["evoked"], d["times"], d["ch_names"], {"central": c["anova_rois"]["central"]},
                                      [[600, 750], [550, 750]])
        out.append([float((y[i][:, 1] - y[i][:, 0]).mean()) for i in range(2)])
        print(f"seed {seed}: 600-750 ms {out[-1][0]:.3f} uV, 550-750 ms {out[-1][1]:.3f} uV", flush=True)
    return out


if __name__ == "__main__":
    import mne

    mne.set_log_level("ERROR")
    if sys.argv[1:2] == ["snr"]:
        snr(tuple(float(x) for x in sys.argv[2:]) or (5.0, 10.0))
    elif sys.argv[1:2] == ["calib"]:
        calib()
    else:
        raise SystemExit(__doc__)
