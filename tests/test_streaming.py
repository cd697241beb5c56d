"""Tables larger than `dataset.resident_table_mb`: read from disk in blocks.

A table in several Parquet files trains resident (copied to every device,
its batches made there), held in memory but streamed from the host
(`resident_table_mb=1`: too large for eight devices' copies), and streamed
from disk (`resident_table_mb=0`: read block by block from its prepared
parts). The first two read the same order and must log the same losses bit
for bit; the disk's block order is its own, and a run streamed from disk
must end as the unbroken run when stopped mid-epoch and resumed. The
multi-process side (each process reading its lanes, 2 x 4 against 1 x 8)
is in tests/test_multihost.py.
"""

import os

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')

import shutil  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from cli_helpers import override  # noqa: E402

from meshfit.configs import csv as csv_config  # noqa: E402
from meshfit.input_pipeline import csv_regression, order  # noqa: E402
from meshfit.input_pipeline.store import Store  # noqa: E402
from meshfit import config as config_lib
from meshfit.data import splits as splits_lib
from meshfit.report import writers
from meshfit.train import loop  # noqa: E402

# Every test here trains (or runs train.py): left out of `make test-fast`.
pytestmark = pytest.mark.slow

ROWS = 6000
STEPS = 40


def _frame(n: int, seed: int) -> pd.DataFrame:
  rng = np.random.default_rng(seed)
  a, b, c = rng.normal(size=(3, n))
  a[rng.random(n) < 0.05] = np.nan  # missing values: a filled, flagged input
  return pd.DataFrame({'a': a, 'b': b, 'c': c,
                       'kind': rng.choice(['p', 'q', 'r'], n),
                       'y': 3 * np.nan_to_num(a) - 2 * b + 0.1 * c})


@pytest.fixture(scope='module')
def table_files(tmp_path_factory) -> tuple[str, str]:
  """The training table as three Parquet files (a glob), and an eval file."""
  root = tmp_path_factory.mktemp('table')
  train = _frame(ROWS, 0)
  for i, part in enumerate(np.array_split(np.arange(ROWS), 3)):
    train.iloc[part].to_parquet(root / f'train-{i}.parquet', index=False)
  _frame(500, 1).to_csv(root / 'eval.csv', index=False)
  return str(root / 'train-*.parquet'), str(root / 'eval.csv')


def _config(table_files, data_dir: str, **changes):
  config = csv_config.get_config()
  config.dataset.train_path, config.dataset.eval_path = table_files
  config.dataset.target_columns = ('y',)
  config.dataset.data_dir = data_dir
  # A streamed table validates on a fraction (folds need it in memory).
  config.dataset.validation = 0.2
  config.model.ensemble_size = 2
  config.model.hidden_sizes = (32, 32)
  config.batch_size = 64
  config.num_train_steps = STEPS
  config.log_every_steps = 10
  config.eval_every_steps = 20
  config.checkpoint_every_steps = 10
  config.plots = False
  override(config, changes)
  return config


def _records(workdir: str) -> list[dict]:
  """metrics.jsonl without what depends on the clock."""
  return [{k: v for k, v in r.items() if 'per_sec' not in k}
          for r in writers.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))]


@pytest.fixture(scope='module')
def runs(table_files, tmp_path_factory) -> dict[str, str]:
  data_dir = str(tmp_path_factory.mktemp('data'))
  workdirs = {}
  for name, mb in (('resident', 1024), ('in_memory', 1), ('streamed', 0)):
    workdirs[name] = str(tmp_path_factory.mktemp(name) / 'run')
    loop.train_and_evaluate(
        _config(table_files, data_dir, **{'dataset.resident_table_mb': mb}),
        workdirs[name])
  workdirs['data_dir'] = data_dir
  return workdirs


def test_a_large_table_stays_on_disk(table_files, runs):
  config = _config(table_files, runs['data_dir'],
                   **{'dataset.resident_table_mb': 0})
  splits = splits_lib.load_splits(config_lib.parse(config).dataset, seed=0)
  assert isinstance(splits.train, Store)
  assert splits.train.num_examples == ROWS
  assert splits.validation.num_examples + splits.blocks.num_rows == ROWS


def test_a_table_in_memory_trains_alike_on_the_devices_and_streamed(runs):
  in_memory, resident = (_records(runs['in_memory']),
                         _records(runs['resident']))
  assert [r['step'] for r in in_memory if 'train/loss' in r] == [10, 20, 30,
                                                                  40]
  assert in_memory == resident


def test_a_table_on_disk_trains_as_well_in_its_block_order(runs):
  losses = {name: [r['val/loss'] for r in _records(runs[name])
                   if 'val/loss' in r]
            for name in ('resident', 'streamed')}
  assert losses['streamed'] != losses['resident']  # another order
  np.testing.assert_allclose(losses['streamed'][-1], losses['resident'][-1],
                             rtol=0.3)


def test_a_streamed_run_resumed_mid_epoch_ends_as_the_unbroken_run(
    table_files, runs, tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(runs['streamed'], workdir)
  # Step 20 of 64-row batches: 1280 rows into an epoch of ~4800.
  for step in ('30', '40'):
    shutil.rmtree(os.path.join(workdir, 'checkpoints', step))
  loop.train_and_evaluate(
      _config(table_files, runs['data_dir'],
              **{'dataset.resident_table_mb': 0}), workdir)
  assert _records(workdir) == _records(runs['streamed'])


def test_a_streamed_table_is_read_a_block_at_a_time(table_files, runs,
                                                   tmp_path, monkeypatch):
  """No read of the training table is larger than a block (the feed, the
  held-out rows and the statistics' sample alike), and it is never read
  whole."""
  sizes = []
  read_rows = Store.read_rows

  def recording(self, start, stop):
    if self.num_examples == ROWS:  # the training split (eval is read whole)
      sizes.append(stop - start)
    return read_rows(self, start, stop)

  def whole(directory, split):
    assert split != 'train', 'the training split was read whole'
    return read_split(directory, split)

  read_split = csv_regression.read_split
  monkeypatch.setattr(Store, 'read_rows', recording)
  monkeypatch.setattr(csv_regression, 'read_split', whole)
  loop.train_and_evaluate(
      _config(table_files, runs['data_dir'],
              **{'dataset.resident_table_mb': 0, 'num_train_steps': 10}),
      str(tmp_path / 'run'))
  assert sizes and max(sizes) <= order.block_rows(ROWS)


def test_a_checkpoint_of_the_block_order_resumes_in_the_rows_order_and_says_so(
    table_files, runs, tmp_path, caplog):
  """A checkpoint without 'order' (an older meshfit read every table in
  blocks) resumes a table held in memory in the rows order, with a warning
  that says the batches differ from an unbroken run's."""
  import json  # noqa: PLC0415
  workdir = str(tmp_path / 'run')
  shutil.copytree(runs['resident'], workdir)
  for step in ('30', '40'):
    shutil.rmtree(os.path.join(workdir, 'checkpoints', step))
  meta_path = os.path.join(workdir, 'checkpoints', '20', 'meta', 'metadata')
  with open(meta_path, encoding='utf-8') as f:
    meta = json.load(f)
  assert meta.pop('order') == 'rows'
  with open(meta_path, 'w', encoding='utf-8') as f:
    json.dump(meta, f)
  loop.train_and_evaluate(
      _config(table_files, runs['data_dir'],
              **{'dataset.resident_table_mb': 1024}), workdir)
  warned = [r.getMessage() for r in caplog.records
            if 'order' in r.getMessage() and r.levelname == 'WARNING']
  assert len(warned) == 1 and 'in the blocks order' in warned[0], warned
  assert 'an older meshfit wrote it' in warned[0]
  assert [r['step'] for r in _records(workdir) if 'train/loss' in r][-1] == 40
