"""EEG datasets: physics of the simulators (planted rhythms at planted electrodes), determinism,
the remote paths through mne's own fetchers (loopback server: success, checksum mismatch,
interrupted download), user-folder sources (EDF, BIDS, DEAP, SEED) and their errors."""
from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from loopback import serve  # noqa: E402

from reprozoo.data import registry as dreg  # noqa: E402
from reprozoo.data.download import DownloadError, sha256_file  # noqa: E402
from reprozoo.data.eeg import common, motor, restricted, sleep  # noqa: E402
from reprozoo.data.eeg.common import band_power  # noqa: E402
from reprozoo.data.registry import DatasetError  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"


def ci(name: str) -> dict:
    return dreg.get(name).params("ci")


def build(module, params, tmp: Path, seed=0, source="offline", path=None):
    raw, out = tmp / "raw", tmp / "out"
    raw.mkdir(parents=True, exist_ok=True)
    info = module.acquire(source=source, params=params, raw_dir=raw, seed=seed, path=path)
    card = module.preprocess(raw_dir=raw, out_dir=out, params=params)
    return raw, out, info, card


def files_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def mi(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mi")
    raw, out, info, card = build(motor, ci("eeg_motor_imagery"), tmp, seed=5)
    return raw, out, info, card


@pytest.fixture(scope="module")
def sl(tmp_path_factory):
    """eeg_sleep at ci through the generic stages (card.json and preview.png as in the workflow)."""
    from reprozoo import stages

    tmp = tmp_path_factory.mktemp("sl")
    raw = tmp / "raw"
    stages.acquire("eeg_sleep", "ci", "offline", raw, raw / "manifest.json")
    card = stages.preprocess("eeg_sleep", "ci", raw, raw / "manifest.json", tmp, tmp / "card.json", tmp / "preview.png")
    return raw, tmp, card


# --- registry and layout -------------------------------------------------------------------------

def test_registry_lists_eeg_family_and_modules_import_without_mne():
    for name, sources in [("eeg_motor_imagery", ["offline", "remote", "path"]),
                          ("eeg_sleep", ["offline", "remote", "path"]), ("eeg_restricted", ["offline", "path"])]:
        spec = dreg.get(name)
        assert spec.family == "eeg" and spec.sources == sources
        assert set(spec.scales) == {"ci", "smoke", "paper"}
    code = ("import sys; import reprozoo.data.eeg.motor, reprozoo.data.eeg.sleep, reprozoo.data.eeg.restricted; "
            "bad = [m for m in ('mne', 'scipy', 'matplotlib', 'pandas') if m in sys.modules]; print(bad); "
            "sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(SRC)}, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # a 'path' source with no path names the config key
    with pytest.raises(DatasetError, match=r"data\.paths\.eeg_restricted"):
        dreg.source_for("eeg_restricted", {"sources": {"eeg_restricted": "path"}, "paths": {}})


def test_regions():
    assert [common.region_of(c) for c in ["Fp1", "F7", "FC3", "C3", "Cz", "CP1", "P3", "PO3", "O1", "T7", "TP8",
                                          "Fpz-Cz", "Pz-Oz", "CB1"]] == [
        "frontal", "frontal", "central", "central", "central", "parietal", "parietal", "occipital", "occipital",
        "temporal", "temporal", "frontal", "parietal", "occipital"]


# --- motor imagery: physics --------------------------------------------------------------------------

def test_motor_layout_and_load(mi):
    raw, out, info, card = mi
    d = motor.load(out)
    p = ci("eeg_motor_imagery")
    assert d.X.dtype == np.float32 and d.X.shape[1:] == (19, int(p["epoch_s"] * p["sfreq"]))
    assert d.sfreq == p["sfreq"] and d.ch_names == p["channels"]
    assert list(d.epochs["label"].unique()) and set(d.epochs["label"]) == {"rest", "left", "right"}
    assert (d.epochs.groupby("subject")["label"].value_counts().unstack()[["left", "right"]] == 5).all().all()
    assert {"subject", "subject_idx", "epoch", "label", "label_id", "split", "fold", "run", "onset_s"} <= set(d.epochs)
    assert d.regions["central"] == ["C3", "Cz", "C4"] and d.regions["occipital"] == ["O1", "O2"]
    assert set(d.channels["region"]) == {"frontal", "central", "parietal", "occipital", "temporal"}
    assert np.isfinite(d.channels[["x", "y", "z"]].to_numpy()).all()
    assert card["sizes"]["label_counts"] == {"rest": 22, "left": 10, "right": 10}
    assert d.subjects is not None and len(d.subjects) == 2 and "f_mu" in d.subjects
    # raw files are in EEGMMIDB's format and layout
    edf = raw / "MNE-eegbci-data/files/eegmmidb/1.0.0/S001/S001R04.edf"
    assert edf.exists() and edf.read_bytes()[192:197] == b"EDF+C"
    assert 3 < d.X.std() < 50 and 5 < d.X[:, d.ch_names.index("C3")].std() < 50  # microvolts


def test_motor_imagery_contralateral_mu_erd(mi):
    """Right-hand imagery desynchronises mu (8-13 Hz) at C3, left-hand at C4; ipsilateral does not drop."""
    d = motor.load(mi[1])
    lab = d.epochs["label"].to_numpy()
    mu = {ch: band_power(d.X[:, d.ch_names.index(ch)], d.sfreq, 8, 13) for ch in ("C3", "C4")}
    beta = {ch: band_power(d.X[:, d.ch_names.index(ch)], d.sfreq, 18, 25) for ch in ("C3", "C4")}

    def ratio(p, a, b):
        return p[lab == a].mean() / p[lab == b].mean()

    assert ratio(mu["C3"], "right", "rest") < 0.6
    assert ratio(mu["C4"], "left", "rest") < 0.6
    assert ratio(mu["C3"], "left", "rest") > 0.85 and ratio(mu["C4"], "right", "rest") > 0.85
    assert ratio(beta["C3"], "right", "rest") < 0.75
    # the mu peak sits at each subject's planted frequency (C3, rest epochs)
    for s, row in d.subjects.iterrows():
        sel = (d.epochs["subject"] == row["subject"]).to_numpy() & (lab == "rest")
        f, p = common.psd(d.X[sel, d.ch_names.index("C3")], d.sfreq)
        band = (f >= 7) & (f <= 14)
        assert abs(f[band][np.argmax(p[:, band].mean(0))] - row["f_mu"]) <= 1.0
    # and the planted mu source is focal: more 8-13 Hz change at C3 than at a distant site (Fp1)
    fp = band_power(d.X[:, d.ch_names.index("Fp1")], d.sfreq, 8, 13)
    assert ratio(fp, "right", "rest") > ratio(mu["C3"], "right", "rest") + 0.2


# --- sleep: physics ----------------------------------------------------------------------------------

def test_sleep_card_preview_and_layout(sl):
    raw, out, card = sl
    saved = json.loads((out / "card.json").read_text())
    assert saved["dataset"] == "eeg_sleep" and saved["source"] == "offline" and saved["sizes"]["n_subjects"] == 2
    assert set(saved["files"]) == {"X.npz", "epochs.parquet", "channels.parquet", "subjects.parquet", "meta.json"}
    assert saved["sizes"]["label_counts"] and all(v > 0 for v in saved["sizes"]["label_counts"].values())
    assert (out / "preview.png").stat().st_size > 10_000
    d = sleep.load(out)
    assert d.X.shape == (30, 19, 1920) and d.X.dtype == np.float32 and d.resp.shape == (30, 1920)
    for _, g in d.epochs.groupby("subject"):  # every stage in every subject, epochs in order
        assert set(g["label"]) == set(sleep.STAGES)
        assert np.allclose(np.diff(g["onset_s"]), 30.0)
    assert (raw / "physionet-sleep-data/SC4001E0-PSG.edf").exists()
    assert (raw / "physionet-sleep-data/SC4001EC-Hypnogram.edf").exists()


def test_sleep_planted_rhythms(sl):
    d = sleep.load(sl[1])
    lab = d.epochs["label"].to_numpy()

    def bp(ch, lo, hi):
        return band_power(d.X[:, d.ch_names.index(ch)], d.sfreq, lo, hi)

    def m(p, stage):
        return p[lab == stage].mean()

    for ch in ("O1", "O2"):  # wake alpha, occipital, gone in N3
        a = bp(ch, 8, 12)
        assert m(a, "W") > 20 * m(a, "N3") and m(a, "W") > 3 * m(a, "N1")
    assert m(bp("O1", 8, 12), "W") > 3 * m(bp("Fz", 8, 12), "W")
    delta = bp("Fz", 0.5, 2)  # N3 delta, high amplitude, frontal
    assert m(delta, "N3") > 10 * m(delta, "W") and m(delta, "N3") > 3 * m(delta, "N2")
    sigma = bp("Cz", 12, 14.5)  # N2 spindles
    assert m(sigma, "N2") > 4 * m(sigma, "W") and m(sigma, "N2") > 4 * m(sigma, "REM")
    theta = bp("Cz", 4, 7)  # N1 / REM theta
    assert m(theta, "N1") > 3 * m(theta, "W") and m(theta, "REM") > 3 * m(theta, "W")
    # N3 slow waves exceed 75 uV peak to peak at frontal sites
    n3 = d.X[lab == "N3", d.ch_names.index("Fz")]
    assert np.median(n3.max(axis=1) - n3.min(axis=1)) > 75


def test_sleep_respiration_depends_on_stage(sl):
    d = sleep.load(sl[1])
    ep = d.epochs
    # the per-epoch rate estimated from the stored signal matches the simulator's ground truth
    assert np.median(np.abs(ep["resp_rate_bpm"] - ep["resp_rate_true"])) < 0.75
    by = ep.groupby("label")[["resp_rate_true", "resp_std"]].mean()
    subj = d.subjects.set_index("subject")
    rel = ep["resp_rate_true"] / ep["subject"].map(subj["resp_rate_bpm"])
    rel_by = rel.groupby(ep["label"]).mean()
    assert rel_by["N3"] < rel_by["W"] and rel_by["REM"] > rel_by["N3"]
    assert by.loc["N3", "resp_std"] > 1.2 * by.loc["REM", "resp_std"]  # deeper breathing in N3
    assert d.resp.dtype == np.float32 and np.isfinite(d.resp).all()


def test_determinism_for_a_seed(sl, mi, tmp_path):
    raw_a = sl[0]
    raw_b = tmp_path / "sleep_again"
    raw_b.mkdir()
    p = ci("eeg_sleep")
    sleep.acquire("offline", p, raw_b, seed=dreg.get("eeg_sleep").seed)
    edf = "physionet-sleep-data/SC4001E0-PSG.edf"
    assert sha256_file(raw_a / edf) == sha256_file(raw_b / edf)
    assert sha256_file(raw_a / "recordings.json") == sha256_file(raw_b / "recordings.json")
    sleep.preprocess(raw_b, tmp_path / "out_b", p)
    assert np.array_equal(sleep.load(sl[1]).X, sleep.load(tmp_path / "out_b").X)
    raw_c = tmp_path / "other_seed"
    raw_c.mkdir()
    motor.acquire("offline", ci("eeg_motor_imagery"), raw_c, seed=6)
    rel = "MNE-eegbci-data/files/eegmmidb/1.0.0/S001/S001R04.edf"
    assert sha256_file(mi[0] / rel) != sha256_file(raw_c / rel)


# --- remote: mne's fetchers against a loopback server --------------------------------------------------

EEGBCI_FILE = "files/eegmmidb/1.0.0/S001/S001R04.edf"


@pytest.fixture
def eegbci_registry(monkeypatch, tmp_path):
    """Point mne's pinned EEGMMIDB checksum registry at ours (mne reads it from mne/data/)."""
    import mne.datasets.eegbci.eegbci as eb
    import pooch.core

    root = tmp_path / "fake_mne"
    (root / "data").mkdir(parents=True)

    def set_hash(sha256: str):
        (root / "data" / "eegbci_checksums.txt").write_text(f"S001/S001R04.edf {sha256}\n")

    monkeypatch.setattr(eb, "files", lambda package: root)
    monkeypatch.setattr(pooch.core.time, "sleep", lambda s: None)  # mne asks pooch for 2 retries, 1 s + 2 s apart
    return set_hash


def _only_complete_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_remote_eegbci_success(mi, eegbci_registry, tmp_path):
    served = mi[0] / "MNE-eegbci-data"
    eegbci_registry(sha256_file(served / EEGBCI_FILE))
    params = {**ci("eeg_motor_imagery"), "remote_subjects": [1]}
    with serve(served) as url:
        raw, out, info, card = build(motor, {**params, "base_url": url + "files/eegmmidb/1.0.0/"},
                                     tmp_path / "dl", source="remote")
    assert info["url"].startswith("http://127.0.0.1") and info["fetcher"] == "mne.datasets.eegbci.load_data"
    got = raw / "MNE-eegbci-data" / EEGBCI_FILE  # mne's own layout
    assert sha256_file(got) == sha256_file(served / EEGBCI_FILE)
    d = motor.load(out)
    assert card["sizes"]["n_epochs"] == 21 and set(d.epochs["subject"]) == {"S001"}
    np.testing.assert_array_equal(d.X, motor.load(mi[1]).X[:21])  # same file, same preprocessing


def test_remote_eegbci_checksum_mismatch(mi, eegbci_registry, tmp_path):
    served = mi[0] / "MNE-eegbci-data"
    eegbci_registry("0" * 64)
    with serve(served) as url:
        with pytest.raises(DownloadError, match=r"(?i)hash.*S001R04\.edf|S001R04\.edf.*hash"):
            motor.acquire("remote", {**ci("eeg_motor_imagery"), "base_url": url + "files/eegmmidb/1.0.0/"},
                          tmp_path / "raw", seed=0)
    assert _only_complete_files(tmp_path / "raw") == []  # nothing partial, nothing unverified


def test_remote_eegbci_interrupted(mi, eegbci_registry, tmp_path):
    served = mi[0] / "MNE-eegbci-data"
    eegbci_registry(sha256_file(served / EEGBCI_FILE))
    with serve(served, truncate=(EEGBCI_FILE,)) as url:
        with pytest.raises(DownloadError, match=r"127\.0\.0\.1:\d+/files/eegmmidb/1\.0\.0/S001/S001R04\.edf"):
            motor.acquire("remote", {**ci("eeg_motor_imagery"), "base_url": url + "files/eegmmidb/1.0.0/"},
                          tmp_path / "raw", seed=0)
    assert _only_complete_files(tmp_path / "raw") == []


@pytest.fixture
def sleep_registry(monkeypatch, tmp_path):
    """Point mne's pinned Sleep-EDF record list (subject, night, SHA-1, file) at ours."""
    import mne.datasets.sleep_physionet.age as age

    csv = tmp_path / "age_records.csv"

    def set_records(psg_sha1: str, hyp_sha1: str):
        csv.write_text("subject,night,record type,age,sex,lights off,sha,fname\n"
                       f"0,1,PSG,33,female,00:38:00,{psg_sha1},SC4001E0-PSG.edf\n"
                       f"0,1,Hypnogram,33,female,00:38:00,{hyp_sha1},SC4001EC-Hypnogram.edf\n")

    monkeypatch.setattr(age, "AGE_SLEEP_RECORDS", str(csv))
    return set_records


def _sha1(p: Path) -> str:
    return hashlib.sha1(p.read_bytes()).hexdigest()


def test_remote_sleep_success(sl, sleep_registry, tmp_path):
    served = sl[0] / "physionet-sleep-data"
    sleep_registry(_sha1(served / "SC4001E0-PSG.edf"), _sha1(served / "SC4001EC-Hypnogram.edf"))
    with serve(served) as url:
        raw, out, info, card = build(sleep, {**ci("eeg_sleep"), "base_url": url}, tmp_path / "dl", source="remote")
    assert info["fetcher"] == "mne.datasets.sleep_physionet.age.fetch_data"
    d = sleep.load(out)
    assert set(d.epochs["subject"]) == {"SC400"} and card["sizes"]["n_epochs"] == 15
    assert d.epochs["resp_rate_true"].isna().all() and d.epochs["resp_rate_bpm"].notna().all()
    np.testing.assert_array_equal(d.X, sleep.load(sl[1]).X[:15])


def test_remote_sleep_checksum_mismatch(sl, sleep_registry, tmp_path):
    served = sl[0] / "physionet-sleep-data"
    sleep_registry("1" * 40, _sha1(served / "SC4001EC-Hypnogram.edf"))
    with serve(served) as url:
        with pytest.raises(DownloadError, match=r"(?i)hash.*SC4001E0-PSG\.edf|SC4001E0-PSG\.edf.*hash"):
            sleep.acquire("remote", {**ci("eeg_sleep"), "base_url": url}, tmp_path / "raw", seed=0)
    assert _only_complete_files(tmp_path / "raw") == []


def test_remote_sleep_interrupted(sl, sleep_registry, tmp_path):
    served = sl[0] / "physionet-sleep-data"
    sleep_registry(_sha1(served / "SC4001E0-PSG.edf"), _sha1(served / "SC4001EC-Hypnogram.edf"))
    with serve(served, truncate=("SC4001E0-PSG.edf",)) as url:
        with pytest.raises(DownloadError, match=r"(?i)incompleteread|broken|127\.0\.0\.1"):
            sleep.acquire("remote", {**ci("eeg_sleep"), "base_url": url}, tmp_path / "raw", seed=0)
    assert _only_complete_files(tmp_path / "raw") == []


# --- user folders ------------------------------------------------------------------------------------

def test_path_sources_read_user_folders(mi, sl, tmp_path):
    _, out, info, _ = build(motor, ci("eeg_motor_imagery"), tmp_path / "mi", source="path",
                            path=str(mi[0] / "MNE-eegbci-data"))
    assert info["version"] == "user" and len(info["user_files"]) == 2
    np.testing.assert_array_equal(motor.load(out).X, motor.load(mi[1]).X)
    _, out, info, _ = build(sleep, ci("eeg_sleep"), tmp_path / "sl", source="path", path=str(sl[0]))
    assert len(info["user_files"]) == 4
    np.testing.assert_array_equal(sleep.load(out).X, sleep.load(sl[1]).X)


@pytest.mark.parametrize("module,name", [(motor, "eeg_motor_imagery"), (sleep, "eeg_sleep"),
                                         (restricted, "eeg_restricted")])
def test_path_errors_name_the_config_key(module, name, tmp_path):
    key = rf"data\.paths\.{name}"
    with pytest.raises(DatasetError, match=key):
        module.acquire("path", ci(name), tmp_path / "raw", seed=0, path=None)
    with pytest.raises(DatasetError, match=key):
        module.acquire("path", ci(name), tmp_path / "raw", seed=0, path=str(tmp_path / "missing"))
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("not EEG")
    with pytest.raises(DatasetError, match=key):
        module.acquire("path", ci(name), tmp_path / "raw", seed=0, path=str(junk))


def test_restricted_offline_bids_stand_in(tmp_path):
    raw, out, info, card = build(restricted, ci("eeg_restricted"), tmp_path, seed=2)
    assert info["format"] == "bids" and (raw / "bids/dataset_description.json").exists()
    assert (raw / "bids/sub-01/eeg/sub-01_task-imagery_run-1_events.tsv").exists()
    d = restricted.load(out)
    assert set(d.epochs["subject"]) == {"sub-01", "sub-02"} and d.ch_names == motor.TEN_TWENTY
    assert list(d.meta["labels"]) == ["rest", "left", "right"]
    lab = d.epochs["label"].to_numpy()
    mu = band_power(d.X[:, d.ch_names.index("C3")], d.sfreq, 8, 13)
    assert mu[lab == "right"].mean() < 0.6 * mu[lab == "rest"].mean()  # labels survive the BIDS round trip


def _alpha_trial(rng, n_ch, n, sfreq, ch_index, on):
    x = rng.standard_normal((n_ch, n)) * 5
    if on:
        x[ch_index] += 30 * np.sin(2 * np.pi * 10 * np.arange(n) / sfreq)
    return x


def test_restricted_deap_reader(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "data_preprocessed_python"
    folder.mkdir()
    o1 = restricted.DEAP_CHANNELS.index("O1")
    for s in (1, 2):
        ratings = np.array([[8, 5, 5, 5], [2, 5, 5, 5], [7, 3, 3, 3]], float)
        data = np.stack([_alpha_trial(rng, 40, 8064, 128, o1, r[0] > 5) for r in ratings]).astype(np.float32)
        with open(folder / f"s{s:02d}.dat", "wb") as fh:
            pickle.dump({"data": data, "labels": ratings}, fh)
    raw, out, info, card = build(restricted, ci("eeg_restricted"), tmp_path, source="path", path=str(folder))
    assert info["format"] == "deap" and len(info["user_files"]) == 2
    d = restricted.load(out)
    assert d.X.shape == (2 * 3 * 5, 32, 512) and d.ch_names == restricted.DEAP_CHANNELS
    assert list(d.meta["labels"]) == ["low", "high"] and (d.epochs["label"] == "high").sum() == 20
    a = band_power(d.X[:, o1], d.sfreq, 9, 11)
    hi = (d.epochs["label"] == "high").to_numpy()
    assert a[hi].min() > 10 * a[~hi].max()  # the planted alpha is in the high-valence trials at O1
    assert {"valence", "arousal", "dominance", "liking", "trial"} <= set(d.epochs)


def test_restricted_seed_reader(tmp_path):
    from scipy.io import savemat

    rng = np.random.default_rng(1)
    folder = tmp_path / "Preprocessed_EEG"
    folder.mkdir()
    savemat(folder / "label.mat", {"label": np.array([[1, 0, -1]])})
    o1 = restricted.SEED_CHANNELS.index("O1")
    for subj, date in ((1, "20131027"), (2, "20140404")):
        savemat(folder / f"{subj}_{date}.mat",
                {f"ab_eeg{t + 1}": _alpha_trial(rng, 62, 200 * 25, 200, o1, lab == 1)
                 for t, lab in enumerate([1, 0, -1])})
    raw, out, info, card = build(restricted, ci("eeg_restricted"), tmp_path, source="path", path=str(folder))
    assert info["format"] == "seed"
    d = restricted.load(out)
    assert d.X.shape == (2 * 3 * 5, 62, 512) and d.ch_names[:3] == ["Fp1", "Fpz", "Fp2"] and "CB1" in d.ch_names
    assert list(d.meta["labels"]) == ["negative", "neutral", "positive"]
    a = band_power(d.X[:, d.ch_names.index("O1")], d.sfreq, 9, 11)
    pos = (d.epochs["label"] == "positive").to_numpy()
    assert a[pos].min() > 10 * a[~pos].max()
    assert d.regions["occipital"][-1] == "CB2"


def test_readers_share_one_acquire_that_names_the_allowed_sources(tmp_path):
    from reprozoo.data.eeg import motor, sleep
    from reprozoo.data.registry import DatasetError

    for reader in (motor, sleep):
        with pytest.raises(DatasetError, match=r"allowed: \['offline', 'remote', 'path'\]"):
            reader.acquire("ftp", {}, tmp_path, 0)
        empty = tmp_path / reader.NAME
        empty.mkdir()
        with pytest.raises(DatasetError, match=f"data.paths.{reader.NAME}"):
            reader.acquire("path", {}, tmp_path, 0, path=str(empty))
