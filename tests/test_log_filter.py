"""Which log records reach the console."""

import logging
import os
import sys

import pytest

from meshfit.report.log_filter import LogFilter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where a library's module is, wherever the environment keeps it.
SITE = os.path.dirname(os.path.dirname(os.path.abspath(pytest.__file__)))
JAX = os.path.join(SITE, 'jax', '_src', 'xla_bridge.py')
OPTAX = os.path.join(SITE, 'optax', 'schedules', '_schedule.py')
ORBAX = os.path.join(SITE, 'orbax', 'checkpoint', 'checkpoint_manager.py')
OURS = os.path.join(ROOT, 'meshfit', 'train', 'loop.py')


def _record(path: str, level: int, message: str = 'a message',
            exc_info=None) -> logging.LogRecord:
  return logging.LogRecord('absl', level, path, 1, message, (), exc_info)


def _shown(log_filter: LogFilter, *args, **kwargs) -> bool:
  return bool(log_filter.filter(_record(*args, **kwargs)))


def test_meshfit_info_shows_and_libraries_info_does_not():
  quiet = LogFilter()
  assert _shown(quiet, OURS, logging.INFO, 'Resuming from the checkpoint')
  assert _shown(quiet, os.path.join(ROOT, 'train.py'), logging.INFO)
  assert _shown(quiet, os.path.join(ROOT, 'input_pipeline', 'x.py'),
                logging.INFO)
  assert not _shown(quiet, JAX, logging.INFO,
                    "Unable to initialize backend 'tpu'")
  assert not _shown(quiet, OPTAX, logging.INFO, 'A polynomial schedule')
  assert not _shown(quiet, ORBAX, logging.INFO)


@pytest.mark.parametrize('level', [logging.WARNING, logging.ERROR])
def test_warnings_and_errors_always_show(level):
  other = LogFilter()
  other.joined(1)
  for log_filter in (LogFilter(), LogFilter(library_logs=True), other):
    assert _shown(log_filter, JAX, level)
    assert _shown(log_filter, OURS, level)


def test_library_logs_let_their_info_through():
  loud = LogFilter(library_logs=True)
  assert _shown(loud, JAX, logging.INFO)
  assert _shown(loud, ORBAX, logging.INFO)
  assert _shown(loud, ORBAX, logging.WARNING,
                'Requested `tracked_metric`; did not provide metrics.')


def test_other_processes_show_warnings_only_unless_verbose():
  for process_id, every_process, shown in ((0, False, True), (1, False, False),
                                           (1, True, True)):
    log_filter = LogFilter(library_logs=True, every_process=every_process)
    log_filter.joined(process_id)
    assert _shown(log_filter, OURS, logging.INFO, 'Done: ...') == shown
    assert _shown(log_filter, JAX, logging.INFO) == shown
    assert _shown(log_filter, OURS, logging.WARNING)


def test_orbax_metric_warning_is_dropped_and_storage_tracebacks_cut():
  quiet = LogFilter()
  assert not _shown(quiet, ORBAX, logging.WARNING,
                    'Requested `tracked_metric`; did not provide metrics.')
  try:
    raise OSError('bucket gone')
  except OSError:
    record = _record(ORBAX, logging.ERROR, 'save failed', sys.exc_info())
  assert quiet.filter(record) and record.exc_info is None
  try:
    raise ValueError('ours')
  except ValueError:
    record = _record(OURS, logging.ERROR, 'failed', sys.exc_info())
  assert quiet.filter(record) and record.exc_info is not None
