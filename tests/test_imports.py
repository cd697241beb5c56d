"""The house's shape, read from the source: imports run one way.

train.py -> meshfit -> input_pipeline, models, configs; inside meshfit the
sub-packages import each other in the order of LAYERS (docs/design.md draws
it), and no module imports itself back through others.
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# meshfit's sub-packages, lowest first: each may import only those before it.
# `train` and `serve` are siblings: neither imports the other.
LAYERS = ('errors', 'parallel', 'config', 'data', 'model',
          'checkpoints', 'report', ('train', 'serve'), 'api')
# Top-level packages, lowest first (the same rule between them).
PACKAGES = ('storage', ('models', 'input_pipeline'), 'configs', 'meshfit')
# The folders beside meshfit/ that an installed meshfit holds inside it.
FOLDERS = ('storage', 'models', 'input_pipeline', 'configs')
MAX_LINES = 420


def _rank(order, name):
  for i, entry in enumerate(order):
    if name == entry or (isinstance(entry, tuple) and name in entry):
      return i
  raise AssertionError(f'{name!r} has no place in {order}')


def _modules() -> dict[str, pathlib.Path]:
  """{dotted module name: file} of every package of the project."""
  found = {}
  for package in ('meshfit', *FOLDERS):
    for path in sorted((ROOT / package).rglob('*.py')):
      parts = path.relative_to(ROOT).with_suffix('').parts
      if parts[-1] == '__init__':
        parts = parts[:-1]
      found['.'.join(parts)] = path
  return found


def _canonical(name: str) -> str:
  """A module's name as _modules has it: its folder's. The folders beside
  meshfit are installed inside it (meshfit.storage is storage/)."""
  parts = name.split('.')
  if len(parts) > 1 and parts[0] == 'meshfit' and parts[1] in FOLDERS:
    return '.'.join(parts[1:])
  return name


def _imports(path: pathlib.Path, modules: dict) -> set[str]:
  """The project modules `path` imports at run time (TYPE_CHECKING-only
  imports left out: they never run)."""
  tree = ast.parse(path.read_text())
  skip = set()
  for node in ast.walk(tree):
    if (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
        and node.test.id == 'TYPE_CHECKING'):
      skip.update(id(n) for n in ast.walk(node))
  out = set()
  for node in ast.walk(tree):
    if id(node) in skip:
      continue
    if isinstance(node, ast.Import):
      out.update(_canonical(a.name) for a in node.names
                 if _canonical(a.name) in modules)
    elif isinstance(node, ast.ImportFrom) and node.module:
      module = _canonical(node.module)
      for a in node.names:
        full = _canonical(f'{node.module}.{a.name}')
        if full in modules:
          out.add(full)
        elif module in modules:
          out.add(module)
  return out


def _graph() -> dict[str, set[str]]:
  modules = _modules()
  return {name: _imports(path, modules) for name, path in modules.items()}


def test_meshfit_sub_packages_import_in_one_direction():
  wrong = []
  for module, imported in _graph().items():
    if not module.startswith('meshfit.'):
      continue
    here = module.split('.')[1]
    for target in imported:
      if not target.startswith('meshfit.'):
        continue
      there = target.split('.')[1]
      if here == there:
        continue
      if (_rank(LAYERS, there) >= _rank(LAYERS, here)):
        wrong.append(f'{module} -> {target}')
  assert not wrong, ('imports against the layers '
                     f'{LAYERS}:\n' + '\n'.join(sorted(wrong)))


def test_top_level_packages_import_downwards_only():
  wrong = []
  for module, imported in _graph().items():
    here = module.split('.')[0]
    for target in imported:
      there = target.split('.')[0]
      if there != here and _rank(PACKAGES, there) >= _rank(PACKAGES, here):
        wrong.append(f'{module} -> {target}')
  assert not wrong, '\n'.join(sorted(wrong))


def test_no_import_cycles():
  graph = _graph()
  # A package's __init__ re-exporting its modules is not a cycle of jobs.
  edges = {m: {t for t in ts if not m.startswith(t + '.')}
           for m, ts in graph.items()}
  state, cycle = {}, []

  def visit(node, path):
    state[node] = 'open'
    for nxt in sorted(edges.get(node, ())):
      if state.get(nxt) == 'open':
        cycle.append(path + [nxt])
      elif nxt not in state:
        visit(nxt, path + [nxt])
    state[node] = 'done'

  for node in sorted(edges):
    if node not in state:
      visit(node, [node])
  assert not cycle, ' -> '.join(cycle[0])


def test_every_sub_package_says_what_it_owns():
  for init in sorted((ROOT / 'meshfit').glob('*/__init__.py')):
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc and 'import' in doc.lower(), (
        f'{init.relative_to(ROOT)} needs a docstring saying what it owns and '
        'what it may import')


def _design_map() -> set[str]:
  """The files docs/design.md's module map names, as paths: its tree is
  indented by folder (`meshfit/`, then `  model/`, then `    steps.py`)."""
  design = (ROOT / 'docs' / 'design.md').read_text()
  block = design.split('## How the code is layered', 1)[1].split('\n## ')[0]
  named, folders = set(), []  # folders: (indent, name) of the open ones
  for line in block.splitlines():
    match = re.match(r'^( +)(\S+?)(/|\.py)( |$)', line)
    if not match:
      continue
    indent, name, kind = len(match[1]), match[2], match[3]
    while folders and folders[-1][0] >= indent:
      folders.pop()
    path = '/'.join([f for _, f in folders] + [name])
    if kind == '/':
      folders.append((indent, name))
    else:
      named.add(f'{path}.py')
  return named


def test_design_doc_maps_every_module_where_it_is():
  named = _design_map()
  actual = {str(p.relative_to(ROOT)) for p in
            sorted((ROOT / 'meshfit').rglob('*.py'))
            if p.name != '__init__.py'}
  assert not actual - named, f'docs/design.md does not map: {actual - named}'
  assert not {n for n in named if n.startswith('meshfit/')} - actual, (
      'docs/design.md maps files that are not there')


@pytest.mark.parametrize('package', ['meshfit', 'input_pipeline', 'models',
                                     'configs', 'storage', 'tests'])
def test_no_module_is_too_long(package):
  long = [f'{p.relative_to(ROOT)}: {n}'
          for p in sorted((ROOT / package).rglob('*.py'))
          if (n := len(p.read_text().splitlines())) > MAX_LINES
          and not p.name.startswith('test_')]
  assert not long, f'over {MAX_LINES} lines: {long}'


def test_nothing_edits_sys_path():
  edits = [str(p.relative_to(ROOT)) for p in sorted(ROOT.rglob('*.py'))
           if '.venv' not in p.parts
           and re.search(r'sys\.path\.(insert|append)', p.read_text())
           and p.name != 'test_imports.py']
  assert not edits, edits
