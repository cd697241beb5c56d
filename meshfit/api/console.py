"""What a library call shows: meshfit's own lines and everyone's warnings,
as train.py shows them, without touching the root logger.

For the length of a call, the loggers that meshfit and its libraries log
through get a handler of their own (with train.py's `LogFilter`) and stop
passing records up to the root logger, whose handlers belong to the user;
afterwards they are as they were. Python's last-resort handler would
otherwise print every library warning (JAX's "no GPU found", Orbax's) in a
notebook, and absl's INFO lines (meshfit's report) would not show at all.
"""

import contextlib
import logging
import sys
from collections.abc import Iterator

from meshfit.report.log_filter import LogFilter

# meshfit, Orbax and TFDS log through absl; the others through their own.
LOGGERS = ('absl', 'jax', 'jaxlib', 'orbax', 'tensorflow', 'etils', 'flax',
           'fsspec', 'gcsfs')


class _Handler(logging.Handler):
  """INFO lines to stdout (beside the progress display), warnings and
  errors to stderr; the streams looked up at each record (a notebook
  replaces them)."""

  def emit(self, record: logging.LogRecord) -> None:
    try:
      text = record.getMessage()
      if record.levelno >= logging.WARNING:
        stream, text = sys.stderr, f'{record.levelname}: {text}'
      else:
        stream = sys.stdout
      stream.write(text + '\n')
      stream.flush()
    except Exception:  # noqa: BLE001 (logging's own rule: never raise)
      self.handleError(record)


class _ReadOnlyNotices(logging.Filter):
  """Drops Orbax's notices that a checkpoint opened for reading is read
  only: every predict and evaluate opens one so, on purpose."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not ('/orbax/' in record.pathname and record.levelno < logging.ERROR
                and 'read only' in record.getMessage().replace('_', ' '))


@contextlib.contextmanager
def shown(verbose: int) -> Iterator[None]:
  """meshfit's records on the console while the block runs.

  Args:
    verbose: 0 warnings and errors only; 1 meshfit's INFO lines too; 2 the
      libraries' INFO lines too (train.py --verbose).
  """
  handler = _Handler(logging.INFO if verbose else logging.WARNING)
  handler.addFilter(LogFilter(library_logs=verbose >= 2))
  handler.addFilter(_ReadOnlyNotices())
  saved = []
  for name in LOGGERS:
    logger = logging.getLogger(name)
    saved.append((logger, logger.propagate, logger.level))
    logger.addHandler(handler)
    logger.propagate = False
    if verbose and name == 'absl':
      logger.setLevel(logging.INFO)  # absl's own default hides INFO
  try:
    yield
  finally:
    for logger, propagate, level in saved:
      logger.removeHandler(handler)
      logger.propagate = propagate
      logger.setLevel(level)
