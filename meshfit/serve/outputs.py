"""Where --mode=predict and --mode=export may write: never over the run they
read, and never into a path that cannot take the output."""

import os
import posixpath

from meshfit import storage
from meshfit.errors import UsageError

# A workdir's own entries (README's outputs table): an output there would
# replace a file the run needs (config.json overwritten leaves eval,
# predict and export unable to read the run).
RUN_ENTRIES = ('config.json', 'metrics.jsonl', 'lock', 'loss_curve.png',
               'checkpoints', 'damaged_checkpoints', 'eval', 'profile')
EVENTS_PREFIX = 'events.out.tfevents.'


def check_outside_run(output: str, workdir: str, flag: str) -> None:
  """Refuses an `output` that is the workdir or one of its own entries.

  A new name inside the workdir (runs/x/predictions.csv) is allowed: it
  replaces nothing of the run.

  Raises:
    UsageError: `output` would land on the run's own files.
  """
  # Resolved: a symlink (to the workdir, or to one of its files) must not
  # lead around the check.
  out, run = storage.resolve(output), storage.resolve(workdir)
  if storage.is_remote(out) != storage.is_remote(run):
    return  # one local, one gs://: never the same place
  if storage.is_remote(out):
    out, run = out.rstrip('/'), run.rstrip('/')
    relative, sep = posixpath.relpath(out, run), '/'
  else:
    relative, sep = os.path.relpath(out, run), os.sep
  if out == run:
    raise UsageError(f'{flag} {output!r} is the workdir; write the output '
                     'to a path outside the run')
  if relative.startswith(os.pardir):
    return
  entry = relative.split(sep)[0]
  if entry in RUN_ENTRIES or entry.startswith(EVENTS_PREFIX):
    raise UsageError(
        f'{flag} {output!r} is the run\'s own {entry!r} in the workdir; '
        'writing there would damage the run; name another path')


def check_output_file(output: str, flag: str = '--output') -> None:
  """Refuses a file output that is a directory or has no directory to go
  into, before any work is done."""
  if storage.isdir(output):
    raise UsageError(f'{flag} {output!r} is a directory; name a file in it, '
                     f'e.g. {storage.join(output, "predictions.csv")}')
  if storage.is_remote(output):
    return  # object storage has no directories to create first
  directory = storage.dirname(storage.absolute(output))
  if not storage.isdir(directory):
    raise UsageError(f'cannot write {output!r}: directory {directory!r} does '
                     'not exist; create it first')
  try:
    storage.check_writable(output)
  except storage.StorageError as e:
    raise UsageError(f'{flag}: {e}') from None


def same_file(a: str, b: str) -> bool:
  """Whether two paths lead to one file: the same path once symlinks are
  followed, or (both existing locally) one file under two names."""
  if storage.resolve(a) == storage.resolve(b):
    return True
  if storage.is_remote(a) or storage.is_remote(b):
    return False
  try:
    return os.path.samefile(a, b)
  except OSError:  # one of them does not exist (yet)
    return False
