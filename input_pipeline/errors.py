"""The input pipeline's one exception type: data that cannot be used."""


class DataError(Exception):
  """A data file, column selection or prepared dataset that cannot be used.

  The message says what is wrong and how to fix it, naming the file, the
  column and the first bad row where there is one; `train.py` prints it as
  one `error: ...` line and exits with status 2.
  """
