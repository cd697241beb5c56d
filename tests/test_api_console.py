"""What a library call shows: meshfit's lines and warnings through handlers
of its own, for the length of the call; the root logger left alone."""

import logging
import os

import meshfit
from meshfit.api import console

LOOP = os.path.join(os.path.dirname(meshfit.__file__), 'train', 'loop.py')


def _log(level: int, message: str, path: str = LOOP) -> None:
  """A record as absl's logger gets it from `path` (meshfit's own, unless
  another is named)."""
  logger = logging.getLogger('absl')
  if logger.isEnabledFor(level):
    logger.handle(logger.makeRecord('absl', level, path, 1, message, (),
                                    None))


def test_meshfit_lines_show_during_the_call_and_nothing_stays(capsys):
  root = logging.getLogger()
  before = (list(root.handlers), root.level)
  absl = logging.getLogger('absl')
  absl_before = (list(absl.handlers), absl.propagate, absl.level)
  with console.shown(1):
    _log(logging.INFO, 'Sized to the 219 training rows.')
    _log(logging.INFO, 'Orbax: 12 files written', '/x/orbax/checkpoint.py')
    logging.getLogger('jax._src.xla_bridge').info('Unable to initialize '
                                                  'backend tpu')
    logging.getLogger('jax._src.xla_bridge').warning('a library warning')
  out, err = capsys.readouterr()
  assert out == 'Sized to the 219 training rows.\n'  # no library's INFO
  assert err == 'WARNING: a library warning\n'
  assert (list(root.handlers), root.level) == before
  assert (list(absl.handlers), absl.propagate, absl.level) == absl_before


def test_verbose_0_shows_warnings_only(capsys):
  with console.shown(0):
    _log(logging.INFO, 'Sized to the 219 training rows.')
    _log(logging.WARNING, '3 rows have no target and are left out.')
  out, err = capsys.readouterr()
  assert out == ''
  assert err == 'WARNING: 3 rows have no target and are left out.\n'
