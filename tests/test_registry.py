"""The method registry: every folder is a complete method, and its claims can be evaluated."""
import pytest

from reprozoo import claims, registry
from reprozoo.data import registry as dreg

METHODS = registry.method_ids()


def test_rex_is_registered():
    assert "rex" in METHODS


@pytest.mark.parametrize("method", METHODS)
def test_spec_is_complete(method):
    spec = registry.get(method)
    assert spec.title and spec.paper and spec.claims
    assert any(v.role == "baseline" for v in spec.variants), "every method needs a real baseline"
    for scale in registry.SCALES:
        cfg = spec.config(scale)
        assert isinstance(cfg, dict)
        res = spec.resources_for(scale)
        assert res["threads"] >= 1 and res["mem_mb"] > 0 and res["runtime"] > 0
    for d in spec.datasets:
        dreg.get(d)  # every dataset exists in the dataset registry
    for c in spec.claims:
        assert c.paper_value is not None, f"{method}.{c.id} needs the paper's headline value"
        for metric, variant in claims.tokens(c.expr):
            assert variant in spec.variant_ids, f"{method}.{c.id}: unknown variant {variant}"
    assert hasattr(spec.module(), "train")


def test_unknown_method_error_lists_known():
    with pytest.raises(registry.RegistryError, match="known methods: .*rex"):
        registry.get("nope")


def test_unknown_dataset_error_lists_known():
    with pytest.raises(dreg.DatasetError, match="known datasets: .*gmm2d"):
        dreg.get("nope")


def test_remote_source_for_offline_only_dataset_is_rejected_when_explicit():
    with pytest.raises(dreg.DatasetError, match=r"data\.sources\.gmm2d.*allowed"):
        dreg.source_for("gmm2d", {"source": "offline", "sources": {"gmm2d": "remote"}})
    # the global switch falls back to offline for datasets that have no public source
    assert dreg.source_for("gmm2d", {"source": "remote", "sources": {}}) == "offline"


def test_dataset_parameter_overrides():
    spec = dreg.get("gmm2d")
    assert spec.params("ci", {"n_train": 10})["n_train"] == 10
    with pytest.raises(dreg.DatasetError, match=r"data\.params\.gmm2d\.nope.*allowed"):
        spec.params("ci", {"nope": 1})


def test_datasets_may_differ_by_scale():
    for spec in registry.all_specs():
        for scale in registry.SCALES:
            assert set(spec.datasets_for(scale)) <= set(spec.datasets)


def test_no_method_folder_is_broken():
    """A folder whose spec does not load is left out of runs with a warning; CI must not pass then."""
    assert registry.broken() == {}, registry.broken()


@pytest.mark.parametrize("method", METHODS)
def test_spec_passes_the_lints(method):
    """spec_lint's rules (claims that cannot discriminate on a tie) hold for every method."""
    from reprozoo import spec_lint

    spec_lint.check(registry.get(method))
