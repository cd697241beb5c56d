"""The config checks and helpers that are not covered through training."""

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
