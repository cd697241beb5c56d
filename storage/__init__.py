"""meshfit's one file layer: every run file is a local path or a gs:// URL.

This package owns how meshfit reads and writes files: tables, prepared
copies (read back by byte range), config.json, metrics.jsonl, TensorBoard
events, plots, eval JSON, predictions, exports, the workdir lock and the
listing, renaming and moving of checkpoint and export directories.
Everything else calls these functions with `str` paths and never `open`s
or `os.replace`s a run file itself. Orbax and TensorStore write checkpoint
contents on their own; `configure_environment` points them (and
etils.epath, which Orbax uses for directories) at the same storage.

Local paths behave exactly as the os functions they wrap. gs:// URLs go
through gcsfs with Google's Application Default Credentials, or anonymously
to the emulator named by STORAGE_EMULATOR_HOST. Object storage has no
rename, no append and no O_EXCL; each function's docstring says what it does
instead. Failures a user can fix raise `StorageError` with a one-line
message naming the URL.

It imports nothing from meshfit, input_pipeline, models or configs: both
input_pipeline and meshfit use it.
"""

from meshfit.storage.environment import configure_environment
from meshfit.storage.errors import StorageError
from meshfit.storage.files import (copy_file, copytree, exists, glob, isdir, isfile,
                           list_files, listdir, makedirs, move, open,
                           read_bytes, read_text, remove, rename, rmtree,
                           size)
from meshfit.storage.paths import (SCHEMES, absolute, basename, check_scheme,
                           dirname, is_remote, join, resolve, split_url)
from meshfit.storage.writes import (atomic_write, check_writable, write_errno,
                            write_error, writes_in_place)
from meshfit.storage.streams import (AppendWriter, RangeReader, create_exclusive,
                             read_range)

__all__ = [
    'SCHEMES', 'AppendWriter', 'RangeReader', 'StorageError', 'absolute',
    'atomic_write', 'basename', 'check_scheme', 'check_writable',
    'configure_environment', 'copy_file', 'copytree', 'create_exclusive',
    'dirname', 'exists', 'glob', 'is_remote', 'isdir', 'isfile', 'join',
    'list_files', 'listdir', 'makedirs', 'move', 'open', 'read_bytes',
    'read_range', 'read_text', 'remove', 'rename', 'resolve', 'rmtree',
    'size', 'split_url', 'write_errno', 'write_error', 'writes_in_place',
]
