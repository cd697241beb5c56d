"""The input pipeline's one exception type: data that cannot be used.

Also `one_line`, for the library messages (pandas', Arrow's) it quotes.
"""


class DataError(Exception):
  """A data file, column selection or prepared dataset that cannot be used.

  The message says what is wrong and how to fix it, naming the file, the
  column and the first bad row where there is one; `train.py` prints it as
  one `error: ...` line and exits with status 2.
  """


def one_line(error: Exception) -> str:
  """A library's message on one line: `train.py` prints a single error line.

  Args:
    error: the library's exception.

  Returns:
    Its message, every run of whitespace (newlines too) one space.
  """
  return ' '.join(str(error).split())
