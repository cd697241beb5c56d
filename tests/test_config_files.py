"""The config checks and helpers that are not covered through training."""

import json

import pytest

from configs import default
from meshfit import config_lib


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
  fitted = config_lib.fit_saved_mesh(config, num_devices, per_process)
  assert (fitted.mesh.data, fitted.mesh.model) == expected


def test_a_saved_config_without_newer_keys_gets_their_defaults(tmp_path):
  config = default.get_config()
  config.model.hidden_sizes = (7,)
  path = str(tmp_path / 'config.json')
  config_lib.save_json(config, path)
  with open(path, encoding='utf-8') as f:
    saved = json.load(f)
  del saved['plots'], saved['dataset']['resident_table_mb']
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(saved, f)
  loaded = config_lib.load_json(path)
  assert loaded.plots is True
  assert loaded.dataset.resident_table_mb == 1024
  assert tuple(loaded.model.hidden_sizes) == (7,)  # what was saved stays


@pytest.mark.parametrize('periods, background, expected', [
    ((100, 1000, 1000), False, 100),  # calls of 100: none cut short by a log
    ((100, 1000, 50), False, 50),
    # Checkpoints written in the background end only the calls they take.
    ((100, 1000, 50), True, 100),
    ((97, 1000, 1000), False, 97),   # a period: one call per log
    ((999, 999, 999), False, 128),   # no useful divisor: the most, a power of 2
])
def test_steps_per_call_prefers_a_divisor_of_the_periods(periods, background,
                                                         expected):
  from meshfit import state as state_lib, train_lib  # noqa: PLC0415
  from models.mlp import MlpConfig  # noqa: PLC0415
  config = default.get_config()
  config.model.hidden_sizes = (64, 64)
  (config.log_every_steps, config.eval_every_steps,
   config.checkpoint_every_steps) = periods
  spec = state_lib.ModelSpec(MlpConfig(**config.model), 10, 1)
  assert train_lib.steps_per_call(config, spec, background) == expected
  config.steps_per_call = 3
  assert train_lib.steps_per_call(config, spec, background) == 3
