"""Each member's vocabulary (`models/embeddings.MemberVocabulary`), counted
on its own training rows.

The column plan gives a category value a code when the whole training file
holds it `dataset.category_min_count` times, but a cross-fitted member
trains on four fifths of the rows: a value whose few rows all fall in its
held-out fold has, in that member, an embedding it never trained. Scoring
the fold with it makes the validation loss (which picks the best step and
weighs the members) worse than the ensemble's error on new rows, where the
other members did train it; predicting with it adds noise. So before the
first step every member counts each code on the rows it trains on, and
reads the codes it holds fewer than `model.category_member_min_count` times
as the column's unknown code, which it trains on its own rare values.

With held-out rows instead of folds every member trains on the same rows,
and the same count keeps out the values that only the held-out rows hold.
A table streamed from disk is not counted: that would read it all once
more before the first step, to find values whose every row fell among the
few held out of millions; every member reads every code of the plan.
"""

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from meshfit.input_pipeline.column_plan import UNKNOWN_CODE
from meshfit.input_pipeline.tables import Table
from meshfit.data import splits as splits_lib
from meshfit.data.features import InputLayout
from meshfit.model.setup import Setup
from meshfit.model.state import TrainState
from meshfit.models import embeddings, mlp


def _offsets(layout: InputLayout) -> np.ndarray:
  return np.asarray(embeddings.table_offsets(layout.category_sizes),
                    np.int64)


def _rows(layout: InputLayout, x_NxF: np.ndarray) -> np.ndarray:
  """N x C: each row's codes as rows of the one table of every column's
  codes (their order in `MemberVocabulary`). Taken from the category
  columns alone, so that picking rows afterwards copies no other column."""
  codes_NxC = np.asarray(x_NxF[:, list(layout.category_columns)], np.int64)
  return codes_NxC + _offsets(layout)[None]


def _count(layout: InputLayout, rows_NxC: np.ndarray) -> np.ndarray:
  return np.bincount(rows_NxC.ravel(), minlength=sum(layout.category_sizes))


def member_counts(layout: InputLayout, splits: splits_lib.Splits,
                  members: int) -> np.ndarray | None:
  """M x V: how many of member m's training rows hold each code; None for
  a streamed table (not counted)."""
  if splits.folds:
    rows_NxC = _rows(layout, splits.validation.x_NxF)
    fold_N = splits.validation_fold_N
    per_fold = np.stack([_count(layout, rows_NxC[fold_N == f])
                         for f in range(len(splits.folds))])
    held = np.arange(members) % len(splits.folds)
    return per_fold.sum(axis=0)[None] - per_fold[held]
  if not isinstance(splits.train, Table):
    return None
  total = _count(layout, _rows(layout, splits.train.x_NxF)[
      splits.blocks.rows()])
  return np.broadcast_to(total, (members, len(total)))


def known(layout: InputLayout, counts_MxV: np.ndarray, min_count: int
          ) -> np.ndarray:
  """M x V, 1.0 where a member reads a code as it is: held `min_count`
  times by its training rows, or a column's unknown code (always)."""
  known_MxV = (counts_MxV >= min_count).astype(np.float32)
  known_MxV[:, _offsets(layout) + UNKNOWN_CODE] = 1.0
  return known_MxV


def fit_into(state: TrainState, setup: Setup, splits: splits_lib.Splits,
             min_count: int) -> TrainState:
  """`state` (a fresh one) with every member's vocabulary set.

  Process 0's counts are broadcast, so that every process holds the same
  values whatever its own copy of the rows.
  """
  layout, members = setup.arch.layout, setup.arch.num_members
  counts_MxV = member_counts(layout, splits, members)
  if counts_MxV is None:
    logging.info('Member vocabularies: the training table is streamed from '
                 'disk and not counted; every member reads every code.')
    return state
  known_MxV = known(layout, counts_MxV, min_count)
  rows = state.params[mlp.VOCABULARY]['known'].shape[1]
  padded = np.ones((members, rows), np.float32)
  padded[:, :known_MxV.shape[1]] = known_MxV
  if jax.process_count() > 1:
    padded = multihost_utils.broadcast_one_to_all(padded)
  part = {'known': jax.device_put(
      padded, setup.shardings.params[mlp.VOCABULARY]['known'])}
  # Codes some training row holds, bar the unknown codes (always known).
  held_V = counts_MxV.max(axis=0) > 0
  held_V[_offsets(layout) + UNKNOWN_CODE] = False
  unknown_M = (held_V[None] & (known_MxV < 1)).sum(axis=1)
  logging.info(
      'Member vocabularies: of %d category codes in the training rows, '
      'members read %s as unknown (held fewer than %d times by their own '
      'training rows).', held_V.sum(),
      ', '.join(str(int(u)) for u in unknown_M), min_count)
  return state.replace(params={**state.params, mlp.VOCABULARY: part})
