"""A setting is declared once (bertjax/config/settings.py): one row gives its default in every
config, its check (a bad value refused in one line that quotes its help) and its help text. The
configs resolve as they did before the table (tests/golden/resolved_configs.json), and the sharding
rules are config data whose old spelling () still means the defaults."""

import dataclasses
import json

import pytest

from bertjax.config import config_checks, config_lib, config_rules, settings
from bertjax.core import ranges
from bertjax.core.errors import UserError
from bertjax.models import config as model_config
from bertjax.models.config import ModelConfig
from bertjax.runtime import sharding, workdir as workdir_lib
from configs import common
from tests import resolved_configs
from tests.helpers import REPO

BERT = str(REPO / "configs/bert.py:size=tiny")


def test_every_config_and_variant_resolves_as_recorded():
  golden = json.loads(resolved_configs.FIXTURE.read_text())
  now = resolved_configs.resolve_all()
  assert sorted(now) == sorted(golden)
  changed = [spec for spec in golden if json.dumps(golden[spec], sort_keys=True) != now[spec]]
  assert changed == []


def test_one_row_declares_a_setting_with_its_default_check_and_help(monkeypatch):
  rows = (settings.Setting("masking.keep_rate", 0.1, settings.UNIT,
                           "share of the selected tokens kept as they are"),
          settings.Setting("data.order", "shuffled", ("shuffled", "sequential"),
                           "the order documents are read in"))
  monkeypatch.setattr(settings, "TRAINER", settings.TRAINER + rows)
  config = config_lib.load_config_file(BERT)
  assert (config.masking.keep_rate, config.data.order) == (0.1, "shuffled")   # the default
  config_checks.check_ranges(config)
  config_lib.apply_overrides(config, ["masking.keep_rate=0.2"])
  assert config.masking.keep_rate == 0.2
  config.masking.keep_rate = 1.5
  refusal = (r"^masking.keep_rate=1.5 must be in \[0, 1\] \(share of the selected tokens kept "
             r"as they are\); fix: --config.masking.keep_rate=0.1$")
  with pytest.raises(UserError, match=refusal):
    config_checks.check_ranges(config)
  config.masking.keep_rate = 0.1
  config.data.order = "random"
  with pytest.raises(UserError, match=r"^data.order='random' must be one of shuffled, sequential"):
    config_checks.check_ranges(config)
  assert settings.help_text("masking.keep_rate") == (
      "masking.keep_rate (default 0.1; in [0, 1]): share of the selected tokens kept as they are")
  assert "one of 'shuffled', 'sequential'" in settings.help_text("data.order")
  assert settings.help_text("masking.keep_rate") in settings.describe().splitlines()


def test_one_field_declares_a_model_setting_with_its_default_check_and_help(monkeypatch):
  @dataclasses.dataclass(frozen=True)
  class Wider(ModelConfig):
    rope_scale: float = model_config.setting(1.0, ranges.POSITIVE, "rotary position scaling")

  monkeypatch.setattr(model_config, "ModelConfig", Wider)
  monkeypatch.setattr(common, "ModelConfig", Wider)
  monkeypatch.setattr(settings, "ModelConfig", Wider)
  config = config_lib.load_config_file(BERT)
  assert config.model.rope_scale == 1.0                                        # the default
  config_checks.check_ranges(config)
  config.model.rope_scale = 0.0
  with pytest.raises(UserError, match=r"^model.rope_scale=0.0 must be > 0 \(rotary position "
                                      r"scaling\); fix: --config.model.rope_scale=1.0$"):
    config_checks.check_ranges(config)
  assert settings.help_text("model.rope_scale") == (
      "model.rope_scale (default 1.0; > 0): rotary position scaling")
  assert not hasattr(settings, "MODEL")  # no second table of the model's ranges


def test_the_checks_are_the_declarations():
  assert ("masking.rate", settings.OPEN_UNIT, "fraction of tokens selected for prediction",
          0.15) in config_rules.RULES
  assert ("batch_size", settings.AT_LEAST_1) == config_rules.RULES[1][:2]
  assert config_rules.RULES[1][3] == 32   # an example other than the default
  assert dict(config_rules.CHOICES)["best_mode"] == ("max", "min")
  declared = {s.key for s in settings.declared()}
  assert len(declared) == len(settings.declared())   # no key declared twice
  ruled = {key for key, *_ in config_rules.RULES} | {key for key, _ in config_rules.CHOICES}
  assert ruled <= declared


def test_every_setting_of_the_shared_configs_is_declared_with_help():
  config = common.finetune_config()
  keys = set(workdir_lib.flatten(config.to_dict()))
  trainer = {s.key for s in settings.TRAINER + settings.FINETUNE}
  assert {k for k in keys if not k.startswith("model.")} == trainer
  for key in trainer:
    assert settings.help_text(key).startswith(f"{key} (default ")
  with pytest.raises(KeyError):
    settings.help_text("masking.no_such_setting")


def test_model_settings_take_their_defaults_from_model_config():
  fields = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
  for setting in settings.model_settings():
    name = setting.key.removeprefix("model.")
    assert name in fields, name
    assert setting.default == fields[name]


def test_logical_rules_are_config_data_and_empty_still_means_the_defaults():
  config = config_lib.load_config_file(BERT)
  assert config.logical_rules == sharding.DEFAULT_RULES
  assert sharding.rules_from_config(config) == sharding.DEFAULT_RULES
  config_lib.apply_overrides(config, ["logical_rules=(('heads', None), ('act_batch', 'data'))"])
  assert sharding.rules_from_config(config) == (("heads", None), ("act_batch", "data"))
  config.logical_rules = ()
  assert sharding.rules_from_config(config) == sharding.DEFAULT_RULES


def test_a_workdir_recorded_with_empty_rules_resumes(tmp_path):
  config = config_lib.load_config_file(BERT)
  old = config.to_dict()
  old["logical_rules"] = []   # how config.json held the default before the rules were data
  (tmp_path / "config.json").write_text(json.dumps(old, default=str))
  check = workdir_lib.Settings(tmp_path, allow_changes=False)
  check.check(config.to_dict())   # placement: allowed, recorded as a change
  assert list(check.changed) == ["logical_rules"] and check.forced == []
