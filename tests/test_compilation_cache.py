"""The persistent compilation cache setting."""

import os

import jax
import jax.numpy as jnp
import pytest

from meshfit.configs import default
from meshfit import config as config_lib
from meshfit.errors import UsageError
from meshfit.parallel import compilation_cache


@pytest.fixture
def restore_cache_setting():
  before = jax.config.jax_compilation_cache_dir
  yield
  compilation_cache.configure(before or '')


def test_compiled_programs_are_written_to_the_cache_dir(
    tmp_path, restore_cache_setting):
  path = compilation_cache.configure(str(tmp_path / 'jax'))
  assert path == str(tmp_path / 'jax')
  # A program this small compiles in milliseconds: cached all the same.
  jax.jit(lambda x: x * 3 + 1)(jnp.arange(7.0)).block_until_ready()
  assert any(name.startswith('jit__lambda') for name in os.listdir(path))


def test_empty_dir_turns_the_cache_off(tmp_path, restore_cache_setting):
  compilation_cache.configure(str(tmp_path / 'jax'))
  assert compilation_cache.configure('') is None
  assert jax.config.jax_compilation_cache_dir is None
  jax.jit(lambda x: x * 5 - 2)(jnp.arange(9.0)).block_until_ready()
  assert not os.path.exists(tmp_path / 'jax') or not any(
      'lambda' in name for name in os.listdir(tmp_path / 'jax'))


def test_validate_refuses_a_file_as_cache_dir(tmp_path):
  config = default.get_config()
  config.compilation_cache_dir = str(tmp_path / 'a_file')
  (tmp_path / 'a_file').write_text('')
  with pytest.raises(UsageError, match='compilation_cache_dir'):
    config_lib.parse(config)
