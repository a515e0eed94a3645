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


def test_overrides_from_the_command_line_are_coerced_to_the_config_types():
    # snakemake --config params='{rex: {zeta: 0.99}}' hands the value over as a string
    cfg = rz_config.load({"scale": "ci", "params": {"rex": {"zeta": "0.99", "denoiser": {"steps": "7"},
                                                             "steps_roundtrip": ["5", "10"]}}})
    p = rz_config.method_params(cfg, "rex")
    assert p["zeta"] == 0.99 and isinstance(p["zeta"], float)
    assert p["denoiser"]["steps"] == 7 and isinstance(p["denoiser"]["steps"], int)
    assert p["denoiser"]["width"] == registry.get("rex").config("ci")["denoiser"]["width"]  # the rest kept
    assert p["steps_roundtrip"] == [5, 10]


def test_wrong_type_and_nested_typo_name_the_key_before_any_job():
    cfg = rz_config.load({"scale": "ci", "methods": ["rex"], "params": {"rex": {"zeta": "abc"}}})
    with pytest.raises(rz_config.ConfigError, match=r"params\.rex\.zeta.*not a number"):
        rz_config.plan(cfg)
    cfg = rz_config.load({"scale": "ci", "methods": ["rex"], "params": {"rex": {"denoiser": {"stepz": 5}}}})
    with pytest.raises(rz_config.ConfigError, match=r"params\.rex\.denoiser.*stepz.*allowed.*steps"):
        rz_config.plan(cfg)
    cfg = rz_config.load({"scale": "ci", "methods": ["rex"], "params": {"rex": {"n_test": 2.5}}})
    with pytest.raises(rz_config.ConfigError, match=r"params\.rex\.n_test.*an integer"):
        rz_config.plan(cfg)


def test_a_subset_selection_gets_its_own_results_folder():
    full = rz_config.plan(rz_config.load({"scale": "ci", "methods": ["rex"]}))
    assert full.selection("rex") == "" and full.report_selection() == ""
    part = rz_config.plan(rz_config.load({"scale": "ci", "methods": ["rex"], "variants": {"rex": ["ddim"]}}))
    assert part.selection("rex") == "partial/ddim_seeds0/"
    assert part.report_selection().startswith("partial/")
    more = rz_config.plan(rz_config.load({"scale": "ci", "methods": ["rex"], "seeds": [0, 1]}))
    assert more.selection("rex") == "partial/all_seeds0-1/"


def test_a_runaway_job_is_stopped_with_a_clear_message(monkeypatch):
    import time

    from reprozoo import stages

    monkeypatch.setattr(stages, "RUNTIME_FACTOR", 1.0)
    with pytest.raises(stages.JobTimeLimit, match="ran past 1 x its runtime"):
        with stages.time_limit(1 / 60, "train rex"):   # 1 s
            time.sleep(5)
    assert not stages.retryable(stages.JobTimeLimit("x")) and stages.retryable(MemoryError())
