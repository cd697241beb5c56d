"""config.json and the saved config: defaults for newer keys, a fitting mesh."""

import dataclasses
import json
import pathlib
from unittest import mock

import pytest
from absl import logging

from meshfit.configs import default
from meshfit import config as config_lib
from meshfit.config import json_files, spellings
from meshfit.errors import UsageError


@pytest.mark.parametrize('saved, num_devices, per_process, expected', [
    ((4, 2), 8, None, (4, 2)),   # fits: kept
    ((4, 2), 8, 8, (4, 2)),      # one process holds every device
    ((4, 2), 8, 2, (4, 2)),      # 'model' fits each of 4 processes
    ((2, 4), 8, 2, (-1, 1)),     # 'model' would cross hosts: all on 'data'
    ((4, 2), 1, None, (-1, 1)),  # does not tile one device
])
def test_fit_saved_mesh(saved, num_devices, per_process, expected):
  config = default.get_config()
  config.mesh.data, config.mesh.model = saved
  fitted = json_files.fit_saved_mesh(config, num_devices, per_process)
  assert (fitted.mesh.data, fitted.mesh.model) == expected


def test_a_saved_config_without_newer_keys_gets_their_defaults(tmp_path):
  config = default.get_config()
  config.model.hidden_sizes = (7,)
  path = str(tmp_path / 'config.json')
  json_files.save_json(config_lib.parse(config), path)
  with open(path, encoding='utf-8') as f:
    saved = json.load(f)
  del saved['plots'], saved['dataset']['resident_table_mb']
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(saved, f)
  loaded = json_files.load_json(path)
  assert loaded.plots is True
  assert loaded.dataset.resident_table_mb == 1024
  assert tuple(loaded.model.hidden_sizes) == (7,)  # what was saved stays


def test_a_checkpoint_older_than_a_key_resumes_only_at_its_default():
  # A run trained before model.ridge_blend existed had no ridge parts:
  # resuming it with the key at its default is the same model, with
  # ridge_blend=True another one (its state would not even restore).
  trained = config_lib.parse(default.get_config()).to_dict()
  del trained['model']['ridge_blend']
  json_files.check_resume_compatible(
      trained, config_lib.parse(default.get_config()), step=40)
  changed = default.get_config()
  changed.model.ridge_blend = True
  changed.dataset.validation_fraction = 0.2
  trained['dataset']['validation_fraction'] = 0.2
  with pytest.raises(UsageError, match=r'model.ridge_blend \(checkpoint '
                     r'False, now True\)'):
    json_files.check_resume_compatible(trained, config_lib.parse(changed),
                                         step=40)


def test_a_checkpoint_with_keys_this_meshfit_lacks_is_named():
  trained = config_lib.parse(default.get_config()).to_dict()
  trained['model']['linear_head'] = False  # removed; False is what is now
  json_files.check_known_keys(trained, 40, 'w/checkpoints')
  trained['model']['linear_head'] = True
  trained['optimizer']['lookahead'] = 5  # a key of some other meshfit
  with pytest.raises(UsageError, match=r'step 40 in w/checkpoints was trained '
                     r'with model.linear_head=True, optimizer.lookahead=5, '
                     r'which this meshfit does not have'):
    json_files.check_known_keys(trained, 40, 'w/checkpoints')


OLD = pathlib.Path(__file__).parent / 'data' / 'config_with_old_keys.json'


def test_a_config_json_with_the_old_keys_loads_as_now():
  # configs/csv.py's run as an older meshfit saved it: dataset.standardize,
  # dataset.validation_folds=5 and dataset.validation_fraction=0.0.
  loaded = json_files.load_json(str(OLD))
  flat = json_files.flatten(loaded)
  assert not set(flat) & set(spellings.RENAMED)
  assert (loaded.dataset.validation, loaded.dataset.numeric_scaling) == (
      5, 'quantile')
  config = config_lib.parse(loaded)
  assert config.dataset.validation_folds == 5
  assert config.dataset.validation_fraction == 0.0
  assert set(flat) == set(json_files.flatten(default.get_config()))


def test_a_checkpoint_with_the_old_keys_resumes_and_is_known():
  trained = json.loads(OLD.read_text())
  now = config_lib.parse(json_files.load_json(str(OLD)))
  json_files.check_known_keys(trained, 40, 'w/checkpoints')
  json_files.check_resume_compatible(trained, now, step=40)
  moved = dataclasses.replace(now, dataset=dataclasses.replace(
      now.dataset, validation=0.2))
  with pytest.raises(UsageError, match=r'dataset.validation \(checkpoint 5, '
                     r'now 0.2\)'):
    json_files.check_resume_compatible(trained, moved, step=40)
  raw = dict(trained, dataset=dict(trained['dataset'], standardize=False))
  assert config_lib.parse(raw).dataset.numeric_scaling == 'none'


def test_a_config_file_with_the_old_keys_is_read_with_a_warning():
  raw = default.get_config()
  raw.dataset.validation_fraction = 0.2  # what an older config file set
  raw.dataset.standardize = False
  with mock.patch.object(logging, 'warning') as warning:
    config = config_lib.parse(raw)
  assert (config.dataset.validation, config.dataset.numeric_scaling) == (
      0.2, 'none')
  said = ' '.join(str(c.args) for c in warning.call_args_list)
  assert 'dataset.validation=0.2' in said
  assert "dataset.numeric_scaling='none'" in said
  raw.dataset.validation_folds = 5
  with pytest.raises(UsageError, match='are both set; choose one'):
    config_lib.parse(raw)


@pytest.mark.parametrize('given_keys', [(), ('compilation_cache_dir',)])
def test_the_compilation_cache_is_the_invoking_users_not_the_workdirs(
    given_keys):
  # A shared workdir's config.json must not choose the directory of native
  # code that this user's process loads and runs.
  saved = default.get_config()
  saved.compilation_cache_dir = '/shared/someone_elses/jax'
  given = default.get_config()
  if given_keys:
    given.compilation_cache_dir = '/home/me/.cache/jax'
  merged = json_files.merge_eval_overrides(saved, given, given_keys)
  assert merged.compilation_cache_dir == given.compilation_cache_dir
