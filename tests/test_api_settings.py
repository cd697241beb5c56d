"""What `fit` is given, as train.py would be given it: configs in their
three forms, and a DataFrame as the Parquet file of the same frame."""

import os

import ml_collections
import pandas as pd
import pytest

from cli_helpers import ROOT
from meshfit.configs import csv, linear
from meshfit.input_pipeline import table_files
from meshfit.api import settings
from meshfit.errors import UsageError


def test_a_config_is_a_file_a_config_dict_or_dotted_keys_over_csv():
  assert settings.resolve_config(None).to_dict() == csv.get_config().to_dict()
  path = os.path.join(ROOT, 'configs', 'linear.py')
  assert (settings.resolve_config(path).to_dict()
          == linear.get_config().to_dict())
  given = linear.get_config()
  copied = settings.resolve_config(given)
  copied.seed += 1
  assert given.seed == linear.get_config().seed  # a copy, not the caller's
  dotted = settings.resolve_config({'model.hidden_sizes': (8,), 'seed': 3})
  assert dotted.model.hidden_sizes == (8,) and dotted.seed == 3
  assert dotted.optimizer.name == csv.get_config().optimizer.name


@pytest.mark.parametrize('config, message', [
    (42, 'config must be a config file, a ConfigDict or a dict'),
    ('no/such/config.py', 'cannot load config file no/such/config.py'),
    ({'model.hiden_sizes': (8,)}, "did you mean 'model.hidden_sizes'"),
])
def test_a_bad_config_is_a_usage_error(config, message):
  with pytest.raises(UsageError, match=message):
    settings.resolve_config(config)


def test_a_frame_is_written_once_as_its_parquet_file(tmp_path):
  frame = pd.DataFrame({'a': [1.5, None, 3.0], 'b': ['x', 'y', None],
                        'when': pd.to_datetime(['2020-01-01', None,
                                                '2021-06-30'])},
                       index=[10, 11, 12])
  path = settings.path_of(frame, str(tmp_path), 'dataset.train_path')
  assert path.startswith(str(tmp_path / settings.FRAMES_DIR))
  written = os.path.getmtime(path)
  assert settings.path_of(frame.copy(), str(tmp_path), 'x') == path
  assert os.path.getmtime(path) == written  # found, not written again
  own = tmp_path / 'own.parquet'
  frame.to_parquet(own, index=False)
  with open(path, 'rb') as a, open(own, 'rb') as b:
    assert a.read() == b.read()
  # Read in memory as the file is read.
  pd.testing.assert_frame_equal(settings.frame_of(frame, 'data'),
                                table_files.read_frame(str(own), 'data'))
  other = settings.path_of(frame.assign(a=[1.5, 2.0, 3.0]), str(tmp_path),
                           'x')
  assert other != path
  assert settings.path_of('rows.csv', str(tmp_path), 'x') == 'rows.csv'


def test_a_target_is_a_name_or_a_tuple_of_names():
  assert settings.targets_of('y') == ('y',)
  assert settings.targets_of(['a', 'b']) == ('a', 'b')
  with pytest.raises(UsageError, match='target'):
    settings.targets_of(())
  assert isinstance(settings.resolve_config(None), ml_collections.ConfigDict)
