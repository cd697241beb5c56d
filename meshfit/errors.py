"""meshfit's exception for a request it cannot carry out (exit status 2)."""


class UsageError(Exception):
  """Bad config, flags or workdir state (bad data is `DataError`).

  `train.py` turns it into a single `error: <message>` line on stderr and exit
  status 2, so the message must say what is wrong and how to fix it.
  """
