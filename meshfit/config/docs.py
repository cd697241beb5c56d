"""docs/usage.md's settings table, made from configs/default.py.

    python -m meshfit.config.docs     # rewrites the table in docs/usage.md

The table sits between two HTML comments (BEGIN, END); nothing else in the
file is touched. tests/test_config.py fails while the table and the
declarations differ.
"""

import pathlib
import sys

from meshfit.configs import default
from meshfit.configs.settings import EVAL, INVOKER, NEVER, RESUME, Setting

USAGE = pathlib.Path(__file__).resolve().parents[2] / 'docs' / 'usage.md'
BEGIN = ('<!-- settings table: made from configs/default.py by '
         '`python -m meshfit.config.docs`; edit the declarations there -->')
END = '<!-- end of the settings table -->'
_CHANGES = {EVAL: 'eval, predict, resume', RESUME: 'resume', NEVER: '—',
            INVOKER: "the invoking user's, never the workdir's"}


def _cell(text: str) -> str:
  return text.replace('|', '\\|')


def _row(setting: Setting) -> str:
  default_value = setting.default
  shown = (repr(default_value) if isinstance(default_value, str)
           else str(default_value))
  meaning = setting.help
  if setting.formerly:
    meaning += ' Formerly ' + ' and '.join(f'`{k}`' for k in setting.formerly)
    meaning += '.'
  return (f'| `{setting.key}` | `{shown}` | {_cell(setting.check.describe())} '
          f'| {_CHANGES[setting.changes]} | {_cell(meaning)} |')


def table() -> str:
  """The settings table (markdown), one row per declared key."""
  lines = ['| key | default | accepts | a trained run may change it in '
           '| what it does |', '| --- | --- | --- | --- | --- |']
  lines += [_row(s) for s in default.SETTINGS]
  return '\n'.join(lines)


def with_table(document: str) -> str:
  """`document` with the text between BEGIN and END replaced by `table()`.

  Raises:
    ValueError: the document lacks the two markers.
  """
  head, begin, rest = document.partition(BEGIN)
  _, end, tail = rest.partition(END)
  if not begin or not end:
    raise ValueError(f'the document has no lines {BEGIN!r} ... {END!r}')
  return f'{head}{BEGIN}\n{table()}\n{END}{tail}'


def main() -> None:
  """Rewrites the table of docs/usage.md."""
  USAGE.write_text(with_table(USAGE.read_text()))
  print(f'wrote the settings table of {USAGE}', file=sys.stderr)


if __name__ == '__main__':
  main()
