"""Which log records reach the console: meshfit's report, everyone's
warnings and errors, and the libraries' INFO chatter only when asked.

Left alone, JAX says that it found no TPU, its compilation cache that it
was reset, TFDS how it prepares a split and Orbax a dozen lines per
checkpoint: a person reading the console looks for meshfit's lines among
them. train.py puts `LogFilter` on absl's handler (which every Python
logger reaches); --library_logs lets the libraries' INFO records through,
--verbose too. Imports nothing but the standard library: train.py installs
it before JAX starts.
"""

import logging
import os

# meshfit's own code, whose INFO records are its report (the sized batch,
# resuming, the closing line); the rest is libraries.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_OWN = tuple(os.path.join(_ROOT, name) for name in (
    'meshfit' + os.sep, 'input_pipeline' + os.sep, 'models' + os.sep,
    'storage' + os.sep, 'configs' + os.sep, 'train.py'))
# Storage libraries whose records keep their one line but lose their
# tracebacks: a failure that matters reaches the user as meshfit's own
# `error:` line.
_STORAGE = ('/orbax/', '/gcsfs/', '/etils/', '/fsspec/')


class LogFilter(logging.Filter):
  """Drops the records a person does not need to read.

  Attributes:
    library_logs: let the libraries' INFO records through, tracebacks and
      all (--library_logs, --verbose).
    warnings_only: drop every record below WARNING, meshfit's too: set by
      `joined` on the processes other than 0 of a job (process 0 reports
      for them all).
  """

  def __init__(self, library_logs: bool = False, every_process: bool = False):
    """Args:
      library_logs: see the attribute.
      every_process: processes other than 0 show their INFO records too
        (--verbose).
    """
    super().__init__()
    self.library_logs, self._every_process = library_logs, every_process
    self.warnings_only = False

  def joined(self, process_id: int) -> None:
    """This process is `process_id` of its job (0 when it is alone)."""
    self.warnings_only = process_id != 0 and not self._every_process

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno < logging.WARNING and self.warnings_only:
      return False
    if self.library_logs:
      return True
    if any(part in record.pathname for part in _STORAGE):
      record.exc_info, record.exc_text = None, None
    if record.levelno < logging.WARNING:
      return record.pathname.startswith(_OWN)
    # meshfit gives a metric to its best checkpoints only, on purpose.
    return not ('/orbax/' in record.pathname
                and 'did not provide metrics' in record.getMessage())
