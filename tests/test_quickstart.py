"""examples/quickstart.ipynb, executed as a user runs it: a Jupyter kernel
(ipykernel, this interpreter) runs every cell, then the test reads what the
cells left in the kernel and on the page."""

import json
import os

import nbformat
import pytest
from nbclient import NotebookClient

from cli_helpers import ROOT

pytestmark = pytest.mark.slow

NOTEBOOK = os.path.join(ROOT, 'examples', 'quickstart.ipynb')
TABLES = os.path.join(ROOT, '..', 'shared', 'datasets', 'tables')
# Run after the notebook's cells, in its kernel: what they computed.
READ_BACK = '''
import json
_truth = test['body_mass_g'].to_numpy()
_known = ~np.isnan(_truth)
print(json.dumps({
    'rmse': float(np.sqrt(np.mean(
        (predictions['body_mass_g_pred'].to_numpy()[_known] -
         _truth[_known]) ** 2))),
    'sd': float(_truth[_known].std()),
    'evaluate_rmse': scores['rmse'],
    'evaluated_rows': scores['num_examples'], 'test_rows': int(_known.sum()),
    'loaded_equal': bool(np.array_equal(loaded.predict(test), predictions)),
    'loaded_step': loaded.step, 'step': model.step,
    'history_rows': len(model.history),
    'cv_r2': [float(s) for s in r2],
}))
'''


@pytest.fixture(scope='module')
def executed():
  if not os.path.isdir(TABLES):
    pytest.skip(f'the shared tables are not at {TABLES}')
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  notebook.cells.append(nbformat.v4.new_code_cell(READ_BACK))
  NotebookClient(notebook, timeout=600, kernel_name='python3',
                 resources={'metadata': {'path': os.path.dirname(NOTEBOOK)}}
                 ).execute()
  return notebook


def _outputs(notebook, source_start: str) -> list:
  cells = [c for c in notebook.cells
           if c.cell_type == 'code' and c.source.startswith(source_start)]
  assert len(cells) == 1, source_start
  return cells[0].outputs


def test_the_notebook_runs_and_scores_sanely(executed):
  found = json.loads(executed.cells[-1].outputs[-1]['text'])
  # A short run, but it must beat predicting the mean by far (the shared
  # references reach an RMSE of about 0.4 of the target's sd).
  assert found['rmse'] < 0.6 * found['sd']
  assert found['evaluate_rmse'] == pytest.approx(found['rmse'], rel=1e-4)
  assert found['evaluated_rows'] == found['test_rows']
  assert found['loaded_equal'] and found['loaded_step'] == found['step']
  assert found['history_rows'] > 1
  assert len(found['cv_r2']) == 3 and min(found['cv_r2']) > 0.5


def test_the_pages_show_the_model_the_history_and_the_plot(executed):
  summary = _outputs(executed, 'model = meshfit.fit')[-1]['data']
  assert 'meshfit.Model' in summary['text/html']
  assert 'train/loss' in _outputs(executed, 'model.history')[-1][
      'data']['text/plain']
  assert 'image/png' in _outputs(executed, 'model.plot')[-1]['data']
  assert _outputs(executed, 'saved =')[-1]['data']['text/plain'] == 'True'
  # No traceback anywhere, and no library's log lines on stderr.
  for cell in executed.cells:
    for output in cell.get('outputs', []):
      assert output['output_type'] != 'error'
      if output.get('name') == 'stderr':
        assert 'Traceback' not in output['text'], output['text']
