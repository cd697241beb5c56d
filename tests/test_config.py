"""meshfit.config: the typed config and every check of it."""

import ast
import dataclasses
import pathlib
import re
import typing

import pytest

from meshfit.configs import csv as csv_config, default, settings
from meshfit import config as config_lib
from meshfit.config import docs, json_files, spellings
from meshfit.errors import UsageError

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_parse_types_every_section_and_round_trips():
  raw = default.get_config()
  config = config_lib.parse(raw)
  assert isinstance(config.dataset, config_lib.DatasetConfig)
  assert isinstance(config.optimizer, config_lib.OptimizerConfig)
  assert config.model.hidden_sizes == (128, 128)
  assert config.to_dict() == raw.to_dict()
  assert config_lib.parse(config.to_dict()) == config
  assert config_lib.parse(config) is config
  with pytest.raises(dataclasses.FrozenInstanceError):
    config.batch_size = 7  # noqa: the config cannot change after its checks


def test_lists_from_json_become_tuples():
  raw = csv_config.get_config().to_dict()
  raw['dataset'].update(train_path='t.csv', eval_path='e.csv',
                        target_columns=['y'], feature_columns=['a', 'b'])
  raw['model']['hidden_sizes'] = [8, 8]
  config = config_lib.parse(raw)
  assert config.dataset.target_columns == ('y',)
  assert config.dataset.feature_columns == ('a', 'b')
  assert config.model.hidden_sizes == (8, 8)


def test_a_config_without_a_key_names_it():
  raw = default.get_config().to_dict()
  del raw['optimizer']['momentum']
  with pytest.raises(UsageError, match="no key 'optimizer.momentum'"):
    config_lib.parse(raw)


def test_column_selection_is_checked():
  with pytest.raises(UsageError) as e:
    config_lib.check_column_selection(('y', 'z'), ('a', 'z'))
  assert "column 'z' is both a target" in str(e.value)
  with pytest.raises(UsageError, match='target_columns is empty'):
    config_lib.check_column_selection((), ('a',))
  with pytest.raises(UsageError, match="names column 'a' twice"):
    config_lib.check_column_selection(('y',), ('a', 'a'))


@pytest.mark.parametrize('count', [0, -1, 2.5, '3'])
def test_category_min_count_must_be_a_positive_integer(count):
  raw = default.get_config().to_dict()
  raw['dataset']['category_min_count'] = count
  with pytest.raises(UsageError, match='category_min_count=.* must be a '
                     'positive integer'):
    config_lib.parse(raw)


def test_model_axis_must_stay_within_a_process():
  config = default.get_config()
  config.mesh.data, config.mesh.model = 2, 4
  parsed = config_lib.parse(config)
  config_lib.check_devices(parsed, 8, devices_per_process=8)  # one process
  config_lib.check_devices(parsed, 8, devices_per_process=4)
  with pytest.raises(UsageError, match=(
      "mesh.model=4 does not divide the 2 devices of each process: mesh axis "
      "'model' must stay within a host")):
    config_lib.check_devices(parsed, 8, devices_per_process=2)


def _sections():
  from meshfit.config import schema  # noqa: PLC0415
  return schema._SECTIONS  # noqa: SLF001  (the sections parse builds)


def test_the_typed_config_is_the_declarations():
  # Every field of the typed config is a declared key of the declared type,
  # and the declaration alone holds a default: a dataclass field or a
  # default anywhere else would be a second declaration.
  declared = {s.key: s.type for s in default.SETTINGS}
  found = {}
  for cls, prefix in ((config_lib.Config, ''), *(
      (cls, f'{name}.') for name, cls in _sections().items())):
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
      assert (field.default is dataclasses.MISSING
              and field.default_factory is dataclasses.MISSING), (
                  f'{cls.__name__}.{field.name} has a default: declare it in '
                  'configs/default.py only')
      if not (prefix == '' and field.name in _sections()):
        found[prefix + field.name] = hints[field.name]
  assert found == declared, (
      'the typed config and configs/default.py disagree (models/mlp.py\'s '
      'MlpConfig must have a field of the declared type for each model.* key)')


def test_default_config_is_the_declared_defaults():
  flat = json_files.flatten(default.get_config())
  assert flat == {s.key: s.default for s in default.SETTINGS}
  for setting in default.SETTINGS:
    assert setting.check.problem(setting.key, setting.default) is None, (
        setting.key)
    assert setting.help.strip() and setting.check.describe(), setting.key


def test_policy_lists_are_the_declared_ones():
  policy = {s.key: s.changes for s in default.SETTINGS}
  evals = (settings.EVAL, settings.INVOKER)
  assert set(json_files.EVAL_KEYS) == {k for k, c in policy.items()
                                       if c in evals}
  assert set(json_files.INVOKER_KEYS) == {
      k for k, c in policy.items() if c == settings.INVOKER}
  assert set(json_files.RESUME_SAFE_KEYS) == {
      k for k, c in policy.items() if c in evals + (settings.RESUME,)}
  # What the lists are for: an evaluation may set an eval key and no other.
  saved = default.get_config()
  given = default.get_config()
  given.eval_batch_size, given.model.dropout_rate = 64, 0.5
  merged = json_files.merge_eval_overrides(saved, given, ['eval_batch_size'])
  assert merged.eval_batch_size == 64
  with pytest.raises(UsageError, match=r'cannot change model.dropout_rate'):
    json_files.merge_eval_overrides(saved, given, ['model.dropout_rate'])


def _code_files():
  for package in ('meshfit', 'configs', 'models', 'input_pipeline',
                  'storage'):
    yield from sorted((ROOT / package).rglob('*.py'))
  yield ROOT / 'train.py'


def test_keys_are_declared_in_configs_default_only():
  # A key named in code must be declared (a message telling users to set a
  # key meshfit lacks, a check of an undeclared key), be read from the typed
  # config rather than with a default of its own (config.get(key, default)),
  # and sit in no list of keys but the derived ones.
  declared = {s.key for s in default.SETTINGS}
  sections = {k.split('.')[0] for k in declared if '.' in k}
  dotted = re.compile(rf'\b({"|".join(sections)})\.([a-z_]\w*)\b')
  old = set(spellings.RENAMED) | set(json_files.REMOVED_KEYS)
  files = {'json', 'jax_export'}  # model.json is a file, not a key
  problems = []
  for path in _code_files():
    name = path.relative_to(ROOT)
    source = path.read_text()
    tree = ast.parse(source)
    for node in ast.walk(tree):
      if isinstance(node, ast.Constant) and isinstance(node.value, str):
        for match in dotted.finditer(node.value):
          if (match[0] not in declared | old and match[2] not in files
              and path.name != 'spellings.py'):
            problems.append(f'{name}:{node.lineno} names {match[0]}, which '
                            'configs/default.py does not declare')
    for match in re.finditer(r'config\w*(\.\w+)*\.get\(|getattr\(\s*'
                             r'\w*config[\w.]*\s*,[^,)]+,', source):
      line = source[:match.start()].count('\n') + 1
      problems.append(f'{name}:{line} reads a key with a default of its own')
    if path == ROOT / 'configs' / 'default.py':
      continue
    for node in tree.body:
      if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value:
        keys = {n.value for n in ast.walk(node.value)
                if isinstance(n, ast.Constant) and n.value in declared}
        if keys:
          problems.append(f'{name}:{node.lineno} lists keys {sorted(keys)}; '
                          'derive the list from configs/default.py\'s '
                          'declarations')
  assert not problems, '\n'.join(problems)


def test_the_settings_table_of_the_docs_is_the_declarations():
  usage = docs.USAGE.read_text()
  assert docs.with_table(usage) == usage, (
      "docs/usage.md's settings table differs from configs/default.py's "
      'declarations; regenerate it: python -m meshfit.config.docs')
  assert all(f'| `{s.key}` |' in usage for s in default.SETTINGS)
