"""The one exception type of the file layer."""


class StorageError(Exception):
  """A file operation failed for a reason the user can fix.

  The message is one line and names the path or URL; the CLI prints it as
  `error: ...` and exits 2.
  """
