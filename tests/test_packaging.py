"""meshfit as `pip install .` installs it: one top-level package, holding
every module of the checkout, that leaves a user's own `models` and
`configs` alone in a script and in a Jupyter kernel.

The wheel is built from the checkout's files (no network: this
environment's setuptools) and unpacked as pip would install it; its
dependencies are this environment's. A fresh virtual environment with
`pip install .` from PyPI is the same check with downloads (README).
"""

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import nbformat
import pytest
from nbclient import NotebookClient

from cli_helpers import ROOT

# Folders of the checkout -> where the wheel holds them.
FOLDERS = {'meshfit': 'meshfit', 'models': 'meshfit/models',
           'configs': 'meshfit/configs', 'storage': 'meshfit/storage',
           'input_pipeline': 'meshfit/input_pipeline'}
# A user's folder: modules named as meshfit's folders are.
USER_MODULES = {'models.py': "WHO = 'the user'\n",
                'configs.py': "WHO = 'the user'\n"}
CHECK = '''
import models, configs
import meshfit
from meshfit import models as meshfit_models, storage
from meshfit.configs import csv
print(models.WHO, configs.WHO, meshfit.__file__, meshfit_models.__file__,
      storage.__file__, csv.get_config().dataset.name,
      meshfit.Regressor.__module__, sep='|')
'''


@pytest.fixture(scope='module')
def wheel(tmp_path_factory) -> pathlib.Path:
  """The wheel of the checkout's tracked files."""
  source = tmp_path_factory.mktemp('source')
  listed = subprocess.run(['git', 'ls-files'], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.split()
  for name in listed:
    if os.path.isfile(os.path.join(ROOT, name)):
      (source / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy(os.path.join(ROOT, name), source / name)
  out = tmp_path_factory.mktemp('wheel')
  subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps',
                  '--no-build-isolation', '--quiet', '-w', str(out),
                  str(source)], check=True, capture_output=True, timeout=300)
  (built,) = out.glob('meshfit-*.whl')
  return built


@pytest.fixture(scope='module')
def installed(wheel, tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
  """(site-packages holding the unpacked wheel, a user's folder)."""
  site = tmp_path_factory.mktemp('site')
  with zipfile.ZipFile(wheel) as z:
    z.extractall(site)
  user = tmp_path_factory.mktemp('user')
  for name, text in USER_MODULES.items():
    (user / name).write_text(text)
  return site, user


def _check(found: str, site: pathlib.Path) -> None:
  user_models, user_configs, init, models, storage, dataset, module = (
      found.strip().splitlines()[-1].split('|'))
  assert user_models == user_configs == 'the user'
  assert init == str(site / 'meshfit' / '__init__.py')
  assert models == str(site / 'meshfit' / 'models' / '__init__.py')
  assert storage == str(site / 'meshfit' / 'storage' / '__init__.py')
  assert dataset == 'csv_regression'
  assert module == 'meshfit.api.estimator'


def test_the_wheel_holds_meshfit_alone_and_every_module(wheel):
  with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
  assert {n.split('/')[0] for n in names} == {
      'meshfit', wheel.name.split('-py3')[0] + '.dist-info'}
  missing = [f'{folder}/{p.relative_to(pathlib.Path(ROOT) / folder)}'
             for folder in FOLDERS
             for p in sorted((pathlib.Path(ROOT) / folder).rglob('*.py'))
             if f'{FOLDERS[folder]}/'
             f'{p.relative_to(pathlib.Path(ROOT) / folder)}' not in names]
  assert not missing, f'not in the wheel: {missing}'


def test_a_script_imports_its_own_models_and_meshfit(installed):
  site, user = installed
  # The interpreter's own site-packages hold the dependencies; the wheel's
  # folder comes first, as an installed package would.
  env = dict(os.environ, PYTHONPATH=str(site))
  proc = subprocess.run([sys.executable, '-c', CHECK], cwd=user, env=env,
                        capture_output=True, text=True, timeout=300,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  _check(proc.stdout, site)


@pytest.mark.slow
def test_a_jupyter_kernel_imports_its_own_models_and_meshfit(
    installed, monkeypatch):
  site, user = installed
  monkeypatch.setenv('PYTHONPATH', str(site))
  notebook = nbformat.v4.new_notebook(
      cells=[nbformat.v4.new_code_cell(CHECK)])
  NotebookClient(notebook, timeout=300, kernel_name='python3',
                 resources={'metadata': {'path': str(user)}}).execute()
  _check(notebook.cells[0].outputs[-1]['text'], site)
