"""meshfit.config: the typed config and every check of it."""

import dataclasses

import pytest

from configs import csv as csv_config, default
from meshfit import config as config_lib
from meshfit.errors import UsageError


def test_parse_types_every_section_and_round_trips():
  raw = default.get_config()
  config = config_lib.parse(raw)
  assert isinstance(config.dataset, config_lib.DatasetConfig)
  assert isinstance(config.optimizer, config_lib.OptimizerConfig)
  assert config.model.hidden_sizes == (128, 128)
  assert config.to_dict() == raw.to_dict()
  assert config_lib.parse(config.to_dict()) == config
  assert config_lib.parse(config) is config
  with pytest.raises(dataclasses.FrozenInstanceError):
    config.batch_size = 7  # noqa: the config cannot change after its checks


def test_lists_from_json_become_tuples():
  raw = csv_config.get_config().to_dict()
  raw['dataset'].update(train_path='t.csv', eval_path='e.csv',
                        target_columns=['y'], feature_columns=['a', 'b'])
  raw['model']['hidden_sizes'] = [8, 8]
  config = config_lib.parse(raw)
  assert config.dataset.target_columns == ('y',)
  assert config.dataset.feature_columns == ('a', 'b')
  assert config.model.hidden_sizes == (8, 8)


def test_a_config_without_a_key_names_it():
  raw = default.get_config().to_dict()
  del raw['optimizer']['momentum']
  with pytest.raises(UsageError, match="no key 'optimizer.momentum'"):
    config_lib.parse(raw)


def test_column_selection_is_checked():
  with pytest.raises(UsageError) as e:
    config_lib.check_column_selection(('y', 'z'), ('a', 'z'))
  assert "column 'z' is both a target" in str(e.value)
  with pytest.raises(UsageError, match='target_columns is empty'):
    config_lib.check_column_selection((), ('a',))
  with pytest.raises(UsageError, match="names column 'a' twice"):
    config_lib.check_column_selection(('y',), ('a', 'a'))


@pytest.mark.parametrize('count', [0, -1, 2.5, '3'])
def test_category_min_count_must_be_a_positive_integer(count):
  raw = default.get_config().to_dict()
  raw['dataset']['category_min_count'] = count
  with pytest.raises(UsageError, match='category_min_count=.* must be a '
                     'positive integer'):
    config_lib.parse(raw)


def test_model_axis_must_stay_within_a_process():
  config = default.get_config()
  config.mesh.data, config.mesh.model = 2, 4
  parsed = config_lib.parse(config)
  config_lib.check_devices(parsed, 8, devices_per_process=8)  # one process
  config_lib.check_devices(parsed, 8, devices_per_process=4)
  with pytest.raises(UsageError, match=(
      "mesh.model=4 does not divide the 2 devices of each process: mesh axis "
      "'model' must stay within a host")):
    config_lib.check_devices(parsed, 8, devices_per_process=2)


def _sections():
  from meshfit.config import schema  # noqa: PLC0415
  return schema._SECTIONS  # noqa: SLF001  (the sections parse builds)


def test_defaults_live_only_in_configs_default():
  # A default in a dataclass could disagree with configs/default.py's (as
  # MlpConfig's nll_beta 0.0 once did against 0.5): none may have one.
  for cls in (config_lib.Config, *_sections().values()):
    with_defaults = [f.name for f in dataclasses.fields(cls)
                     if f.default is not dataclasses.MISSING
                     or f.default_factory is not dataclasses.MISSING]
    assert not with_defaults, (
        f'{cls.__name__} declares defaults for {with_defaults}: declare them '
        'in configs/default.py only')


def test_dataclass_fields_are_the_keys_of_configs_default():
  raw = default.get_config().to_dict()
  top = {f.name for f in dataclasses.fields(config_lib.Config)}
  assert top == set(raw)
  for name, cls in _sections().items():
    assert {f.name for f in dataclasses.fields(cls)} == set(raw[name]), name
