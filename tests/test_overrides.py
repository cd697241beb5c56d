"""meshfit.config.with_overrides: dotted keys, set as --config.KEY=VALUE
sets them."""

import pathlib
import sys
from unittest import mock

import pytest
from absl import flags
from ml_collections import config_flags
from ml_collections.config_flags import config_path

from meshfit.configs import default
from meshfit import config as config_lib
from meshfit.errors import UsageError

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _command_line(*overrides: str):
  """The config train.py's flag gives for these --config.KEY=VALUE args."""
  values = flags.FlagValues()
  argv = ['train.py', *overrides]
  # The flag takes its overrides from sys.argv when it is defined.
  with mock.patch.object(sys, 'argv', argv):
    config_flags.DEFINE_config_file(
        'config', str(ROOT / 'configs' / 'default.py'), flag_values=values,
        lock_config=True)
  values(argv)
  return values.config


@pytest.mark.parametrize('key, text, value', [
    ('model.hidden_sizes', '(64, 64)', (64, 64)),
    ('model.hidden_sizes', '()', ()),
    ('optimizer.learning_rate', '0.01', 0.01),
    ('optimizer.learning_rate', '1', 1),
    ('mesh.model', '2', 2),
    ('plots', 'false', False),
    ('dataset.name', 'csv_regression', 'csv_regression'),
    ('sweep.learning_rates', '(0.001, 0.003)', (0.001, 0.003)),
])
def test_the_same_config_as_the_command_line(key, text, value):
  cli = _command_line(f'--config.{key}={text}').to_dict()
  assert config_lib.with_overrides(default.get_config(),
                                   {key: text}).to_dict() == cli
  typed = config_lib.with_overrides(default.get_config(), {key: value})
  assert typed.to_dict() == cli
  assert type(config_path.get_value(key, typed)) is type(
      config_path.get_value(key, _command_line(f'--config.{key}={text}')))


def test_the_given_config_is_left_as_it_was_and_the_lock_kept():
  config = default.get_config()
  config.lock()
  out = config_lib.with_overrides(config, {'batch_size': 64,
                                           'model.hidden_sizes': [8]})
  assert (out.batch_size, out.model.hidden_sizes) == (64, (8,))
  assert config.batch_size == 256 and out.is_locked
  assert not config_lib.with_overrides(default.get_config(), {}).is_locked


def test_an_unknown_key_names_the_nearest_declared_one():
  with pytest.raises(UsageError) as e:
    config_lib.with_overrides(default.get_config(),
                              {'model.hiden_sizes': (8,)})
  assert str(e.value) == (
      "unknown config key 'model.hiden_sizes' in model.hiden_sizes=(8,); did "
      "you mean 'model.hidden_sizes'? configs/default.py declares every key")
  assert config_lib.unknown_key_message(
      'batch_sise', '--config.batch_sise=3') == (
          "unknown config key 'batch_sise' in --config.batch_sise=3; did you "
          "mean 'batch_size'? configs/default.py declares every key")
  assert config_lib.unknown_key_message('mesh.model', 'x') is None


@pytest.mark.parametrize('overrides, match', [
    ({'batch_size': 'many'}, 'batch_size=.many.: .*int'),
    ({'batch_size': 2.5}, 'batch_size takes a value of type int, not float'),
    ({'dataset.name': 3}, 'dataset.name takes a value of type str, not int'),
    ({'model': 3}, "'model' is a section of the config"),
])
def test_a_value_of_another_type_is_a_usage_error(overrides, match):
  with pytest.raises(UsageError, match=match):
    config_lib.with_overrides(default.get_config(), overrides)


def test_keys_spelled_the_old_way_are_read_as_now():
  config = default.get_config()
  out = config_lib.with_overrides(config, {
      'dataset.validation_fraction': '0.2', 'dataset.standardize': False})
  assert (out.dataset.validation, out.dataset.numeric_scaling) == (0.2,
                                                                   'none')
  out = config_lib.with_overrides(config, {'dataset.validation_folds': 5})
  assert out.dataset.validation == 5
  # The command line cannot take them (its config is locked): it says how.
  assert config_lib.unknown_key_message(
      'dataset.validation_folds', '--config.dataset.validation_folds=5') == (
          "config key 'dataset.validation_folds' in "
          '--config.dataset.validation_folds=5: dataset.validation_folds is '
          'spelled the old way: write dataset.validation (the same number of '
          'folds)')
