"""Spike-HTR, cold-review repairs (issue 28): the energy saving as an accounting identity (it was the
claim ``reducer_saves_energy``), the reducer network's own cost terms, and a planted learning test
of the spiking path with the reducer."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from reprozoo.methods.spike_htr import ctc as C  # noqa: E402
from reprozoo.methods.spike_htr import data as D  # noqa: E402
from reprozoo.methods.spike_htr.model import E_MAC_PJ, Recognizer  # noqa: E402


def _pair(seed=0):
    """A spiking reducer network and the same weights without the reducer (snn_full's wiring)."""
    torch.manual_seed(seed)
    red = Recognizer(8, 10, (4, 6, 8), 12, heads=2, mlp=16, spiking=True, reducer=True, threshold=0.5)
    full = Recognizer(8, 10, (4, 6, 8), 12, heads=2, mlp=16, spiking=True, reducer=False, threshold=0.5)
    full.load_state_dict(red.state_dict())
    return red.eval(), full.eval()


def test_reducer_network_counts_its_aux_head_and_pooling():
    """The reducer variant pays for its auxiliary CTC head (L d (K+1) MACs) and for the time-mean /
    pooling of the features (2 T L d ACs), even when it keeps every position; nothing else differs
    from the same weights without the reducer."""
    red, full = _pair()
    x = torch.rand(5, 1, 8, 24)
    off, ref = red.costs(x, reduce="off"), full.costs(x)
    L, d, K1, T = off["out"]["L"], 12, 11, 2
    assert off["mac"] - ref["mac"] == pytest.approx(L * d * K1)
    assert off["ac"] - ref["ac"] == pytest.approx(T * L * d * 2)
    assert off["mixer_ac"] == pytest.approx(ref["mixer_ac"])
    assert off["energy_nj"] > ref["energy_nj"]             # the keep-all reducer network costs MORE


@pytest.mark.parametrize("tau", [0.3, 0.6, 0.9])
def test_energy_saving_is_the_mixer_and_head_saving_exactly(tau):
    """What ``reducer_saves_energy`` measured is accounting: encoder, InkCoder and aux head cost the
    same with and without reduction, so energy(reduced) / energy(keep-all) = 1 - (saving of the
    mixer and the CTC head) / energy(keep-all), to float rounding; with a spiking mixer whose cost
    per position is about constant the saving is ~ (1 - kept) x the mixer's share (the smoke's
    ratios 0.873 / 0.838 / 0.844 against 1 - (1 - kept) x snn_full's share 0.875 / 0.858 / 0.859)."""
    red, _ = _pair(1)
    x = torch.rand(6, 1, 8, 24)
    enc = red.encode(x)
    off, cut = red.costs(x, reduce="off", enc=enc), red.costs(x, tau=tau, enc=enc)
    n = float(cut["out"]["lengths"].float().mean())
    L, d, K1 = off["out"]["L"], 12, 11
    head_saving = E_MAC_PJ * 1e-3 * d * K1 * (L - n)
    saving = (off["mixer_nj"] - cut["mixer_nj"]) + head_saving
    assert cut["energy_nj"] / off["energy_nj"] == pytest.approx(1 - saving / off["energy_nj"], rel=1e-9)
    assert off["ac"] - off["mixer_ac"] == pytest.approx(cut["ac"] - cut["mixer_ac"])   # encoder + aux: equal
    if n < L:
        assert cut["energy_nj"] < off["energy_nj"]
