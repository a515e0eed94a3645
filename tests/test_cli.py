"""The reprozoo command line: listing, early config errors, dataset cards."""
import pytest

from reprozoo.cli import main


def test_list_shows_methods_variants_and_claims(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "rex" in out and "rex_euler*" in out and "ddim" in out and "claim roundtrip_exact_score" in out


def test_datasets_list(capsys):
    assert main(["datasets", "list"]) == 0
    assert "gmm2d" in capsys.readouterr().out


def test_run_rejects_unknown_method_before_starting_snakemake(capsys):
    assert main(["run", "nosuch", "--scale", "ci"]) == 2
    assert "known methods" in capsys.readouterr().err


def test_run_rejects_bad_scale():
    with pytest.raises(SystemExit):
        main(["run", "rex", "--scale", "huge"])


def test_unknown_dataset_card(capsys):
    assert main(["datasets", "card", "nosuch"]) == 2
    assert "known datasets" in capsys.readouterr().err
