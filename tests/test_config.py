"""Config validation: every bad value names its key and the allowed values."""
import pytest

from reprozoo import config as rz_config
from reprozoo import registry


def test_default_config_is_valid_and_plans_every_method():
    cfg = rz_config.load()
    plan = rz_config.plan(cfg)
    assert cfg["scale"] == "smoke"
    assert plan.methods == registry.method_ids()
    assert all(plan.seeds[m] for m in plan.methods)


def test_bad_scale_names_key_and_allowed_values():
    with pytest.raises(rz_config.ConfigError) as e:
        rz_config.load({"scale": "huge"})
    msg = str(e.value)
    assert "'scale'" in msg and "ci" in msg and "smoke" in msg and "paper" in msg


def test_unknown_top_level_key():
    with pytest.raises(rz_config.ConfigError, match="unknown config key 'scal'.*allowed keys"):
        rz_config.load({"scal": "ci"})


def test_bad_nested_value_names_path():
    with pytest.raises(rz_config.ConfigError, match=r"data\.source.*allowed values.*offline"):
        rz_config.load({"data": {"source": "ftp"}})


def test_bad_seed_type():
    with pytest.raises(rz_config.ConfigError, match="seeds"):
        rz_config.load({"seeds": "zero"})


def test_unknown_method_lists_known_ones():
    cfg = rz_config.load({"methods": ["rex", "nosuchmethod"]})
    with pytest.raises(rz_config.ConfigError) as e:
        rz_config.plan(cfg)
    assert "nosuchmethod" in str(e.value) and "rex" in str(e.value)


def test_unknown_variant_lists_allowed():
    cfg = rz_config.load({"methods": ["rex"], "variants": {"rex": ["rex_euler", "bogus"]}})
    with pytest.raises(rz_config.ConfigError, match=r"variants\.rex.*bogus.*allowed.*rex_midpoint"):
        rz_config.plan(cfg)


def test_unknown_hyper_parameter_override():
    cfg = rz_config.load({"params": {"rex": {"zetta": 0.9}}})
    with pytest.raises(rz_config.ConfigError, match=r"params\.rex.*zetta.*allowed"):
        rz_config.method_params(cfg, "rex")


def test_overrides_select_variant_seed_scale_and_params():
    cfg = rz_config.load({"scale": "ci", "methods": "rex", "seeds": [3], "variants": {"rex": ["ddim"]},
                          "params": {"rex": {"zeta": 0.99}}})
    plan = rz_config.plan(cfg)
    assert [(j.method, j.variant, j.seed) for j in plan.jobs()] == [("rex", "ddim", 3)]
    assert rz_config.method_params(cfg, "rex")["zeta"] == 0.99
    assert rz_config.method_params(cfg, "rex")["steps_roundtrip"] == registry.get("rex").config("ci")["steps_roundtrip"]
