"""The one exception type that means "the user asked for something we cannot do"."""


class UsageError(Exception):
  """Bad config, flags, data files or workdir state.

  `train.py` turns it into a single `error: <message>` line on stderr and exit
  status 2, so the message must say what is wrong and how to fix it.
  """
