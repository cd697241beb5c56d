"""The training loop's evaluations: members chosen on validation rows.

At every `eval_every_steps` the loop asks `Evaluations.at` to score each
member on the validation rows (`meshfit/model/selection.py` weighs them), to
evaluate the weighted model there (the best step is the best of these) and
on the eval split. Evaluating leaves the loop's state as it is: `at`
returns the weights it chose (a `selection.Choice`) and the loop applies
them (`with_choice`), so what a checkpoint holds is the loop's doing. At
the end `final` evaluates the model that eval and predict use. Without an
eval file (a user's one table) the validation rows' metrics of that model
are the estimate of its error: out of fold with cross-fitting, else on the
held-out rows. Every checkpoint records the latest (`meta`), so that
--mode=eval and the model card report the estimate of the step they read.
"""

import jax
import numpy as np
from absl import logging

from meshfit.checkpoints import checkpointer, reading
from meshfit.config import Config
from meshfit.data import splits as splits_lib
from meshfit.model import (inference, metrics, optim, ridge_fit, selection,
                           state as state_lib, forward)
from meshfit.model.setup import Setup
from meshfit.parallel import sharding
from meshfit.report import writers
from meshfit.train.validation import BestTracker


class Evaluations:
  """The loop's evaluations: the validation rows (which choose the members
  and the best step), then the eval split."""

  def __init__(self, config: Config, setup: Setup,
               splits: splits_lib.Splits, writer: writers.AsyncWriter,
               tracker: BestTracker):
    self._config, self._setup, self._splits = config, setup, splits
    self._writer, self.tracker = writer, tracker
    self._step = forward.jit_eval_step(setup.graphdef, setup.arch.layout,
                                     setup.shardings, setup.mesh,
                                     setup.distribution)
    self._member_step = forward.jit_member_parts(
        setup.graphdef, setup.arch.layout, setup.shardings, setup.mesh)
    self._held_out_step = forward.jit_held_out_member_parts(
        setup.graphdef, setup.arch.layout, setup.shardings, setup.mesh)
    # The encoded training table (`use_encoded_table`), which a
    # cross-fitted run's validation rows are.
    self._table_z = None
    self._hparams = optim.Hyperparameters.of(config)
    self.best_state = None  # a device copy of the best step's state
    self.choice: selection.Choice | None = None  # the latest
    self._last: tuple[int, dict] | None = None
    # Cross-fitted members are validated out of fold (on the host).
    self._folds = max(len(splits.folds), 1)
    self._out_of_fold: dict | None = None
    # The validation metrics (`estimate`) of the latest evaluation and of
    # the best step, each with its step.
    self._latest: dict | None = None
    self._best: dict | None = None

  def use_encoded_table(self, table_z: dict) -> None:
    """Validates a cross-fitted run on the training table the train call
    reads (`steps.jit_encode`, on every device) from now on: the same rows
    as `splits.validation`, encoded once rather than at each evaluation,
    where encoding them was about half of its time (docs/performance.md)."""
    if self._folds > 1 and table_z:
      self._table_z = table_z
      self._held_out_step = forward.jit_held_out_member_parts_of_rows(
          self._setup.graphdef, self._setup.shardings, self._setup.mesh)

  def meta(self) -> dict:
    """What a checkpoint made now records of the evaluations: the members
    chosen and the latest validation metrics (the estimate of the error of
    the state of that step: the reader checks the step)."""
    return {**({'selection': self.choice.to_json()} if self.choice else {}),
            **({'estimate': self._latest} if self._latest else {})}

  def _evaluate(self, state, table) -> dict:
    return inference.evaluate_table(self._setup, state, table,
                                  self._config.eval_batch_size, self._step)

  def _choose(self, step: int, state: state_lib.TrainState
              ) -> selection.Choice:
    """Scores every member on the validation rows (cross-fitted: each row
    by the members that held it out, all the choice reads); the weights
    `sweep.select` gives them (and, with ridge parts, their weight in the
    blend), kept as the latest choice."""
    validation = self._splits.validation
    fold_N = self._splits.validation_fold_N
    if self._folds > 1:  # each row from the members that held it out
      mean, var, ridge_out = inference.held_out_member_parts(
          self._setup, state, validation.x_NxF, fold_N, self._folds,
          self._config.eval_batch_size, self._held_out_step, self._table_z)
    else:
      mean, var, ridge_out = inference.table_member_parts(
          self._setup, state, validation.x_NxF, self._config.eval_batch_size,
          self._member_step)
    stats = jax.device_get(state.stats)
    z = (validation.y_NxT - stats.y_mean_T) / stats.y_std_T
    previous, self.choice = self.choice, selection.choose(
        self._config.sweep.select, mean, var, z, self._setup.distribution,
        fold_N, self._folds)
    if ridge_out is not None:
      networks = self.choice
      self.choice = selection.blend(networks, mean, ridge_out, z, fold_N,
                                    self._folds)
      if self._folds > 1 and np.any(self.choice.ridge_weight_T > 0):
        if networks.loss < self.tracker.best_loss:
          # Out of fold the ridge part has a share: weigh it against the
          # average of the networks, whose spread needs every member's
          # network on every row (a 0 needs nothing more).
          spread_T = selection.spread(
              networks.weights_M, self._every_member(state, mean), z, fold_N,
              self._folds)
          self.choice = selection.blend(networks, mean, ridge_out, z, fold_N,
                                        self._folds, spread_T)
        else:
          # A step that does not improve the networks' loss never becomes
          # the model: the spread's extra passes are spared, and its
          # networks go alone.
          self.choice = selection.unblended(networks, z.shape[1])
    if state.num_members > 1 and (
        previous is None or previous.chosen() != self.choice.chosen()):
      logging.info('Step %d: %s.', step,
                   self.choice.describe(self._hparams))
    if self._folds > 1:
      self._out_of_fold = self._out_of_fold_metrics(mean, ridge_out, stats)
    return self.choice

  def _every_member(self, state: state_lib.TrainState,
                    held_MxNxT: np.ndarray) -> np.ndarray:
    """Every member's network on every validation row of a cross-fitted
    run, given the members' on the rows they held out: the same program
    (`self._held_out_step`) on the folds shifted by one to F - 1."""
    validation = self._splits.validation
    fold_N, folds = self._splits.validation_fold_N, self._folds
    every_MxNxT = held_MxNxT.copy()
    member_fold_M = np.arange(len(every_MxNxT)) % folds
    for shift in range(1, folds):
      shifted_N = (fold_N + shift) % folds
      mean, _, _ = inference.held_out_member_parts(
          self._setup, state, validation.x_NxF, shifted_N, folds,
          self._config.eval_batch_size, self._held_out_step, self._table_z)
      rows_MxN = member_fold_M[:, None] == shifted_N[None]
      every_MxNxT[rows_MxN] = mean[rows_MxN]
    return every_MxNxT

  def _out_of_fold_metrics(self, mean_MxNxT, ridge_MxNxT, stats) -> dict:
    """The chosen ensemble's metrics on the validation rows, each row
    predicted by the members that did not train on it."""
    folds, validation = self._folds, self._splits.validation
    fold_N = self._splits.validation_fold_N
    if ridge_MxNxT is not None:  # each member's prediction: the blend
      weight_T = self.choice.ridge_weight_T
      mean_MxNxT = mean_MxNxT + weight_T * (ridge_MxNxT - mean_MxNxT)
    bags_BxNxT = selection.out_of_fold(mean_MxNxT, fold_N, folds)
    weights_B = self.choice.weights_M[::folds] * folds
    used = weights_B > 0  # a diverged bag's NaN must not reach the sum
    pred_NxT = (np.tensordot(weights_B[used].astype(np.float64),
                             bags_BxNxT[used], axes=1)
                * stats.y_std_T + stats.y_mean_T)
    y_std_T = np.asarray(stats.y_std_T, np.float64)
    total = metrics.RegressionSums.of_host(pred_NxT, validation.y_NxT,
                                           stats.y_mean_T, y_std_T)
    return inference.summarize(total, y_std_T, validation.target_names, False)

  def at(self, step: int, state: state_lib.TrainState
         ) -> tuple[selection.Choice | None, float | None]:
    """Evaluates `state` on the validation rows, choosing its members
    there, then on the eval split (with the members' weights chosen).

    `state` is left as it is: the caller applies the choice
    (`with_choice`).

    Returns:
      The members' weights chosen (None without validation rows), and the
      validation loss if this is the best step so far (else None).
    """
    scalars, improved, choice = {}, False, None
    if self._splits.validation is not None:
      choice = self._choose(step, state)
      state = with_choice(state, choice, self._setup)  # this copy only
      validation = self._validate(step, state)
      # val/loss ranks the steps; with ridge parts it is the networks' own
      # and the blend's is val/loss_blended.
      scalars.update({**_eval_scalars('val', validation),
                      'val/loss': choice.step_loss})
      if choice.ridge_weight_T is not None:
        weight_T = choice.ridge_weight_T
        scalars['val/loss_blended'] = choice.loss
        scalars['val/ridge_weight'] = float(np.mean(weight_T))
        if len(weight_T) > 1:
          scalars.update({f'val/ridge_weight/{t}': float(w) for t, w in zip(
              self._splits.validation.target_names, weight_T)})
      if state.num_members > 1:
        best = choice.best_member
        scalars.update({
            'val/loss_best_member': float(choice.member_losses_M[best]),
            'val/loss_all_members': choice.all_loss,
            'val/members_chosen': float(len(choice.chosen()))})
      improved = self.tracker.update(step, choice.step_loss)
      if improved:
        self._best = self._latest
    if self._splits.eval is not None and (
        self._config.eval_during_training or self._splits.validation is None):
      result = self._evaluate(state, self._splits.eval)
      self._last = (step, result)
      scalars = {**_eval_scalars('eval', result), **scalars}
    self._writer.write_scalars(step, scalars)
    self._writer.flush()
    return choice, (self.tracker.best_loss if improved else None)

  def final(self, state: state_lib.TrainState,
            ckpt: checkpointer.Checkpointer, trained: bool) -> dict:
    """The evaluation of the model eval and predict use, with its step.

    Without `eval_during_training` the eval split is scored here only, and
    (when this process trained) its scalars are logged at the last step.
    """
    result = self._final(state, ckpt)
    if trained and self._splits.eval is not None and not (
        self._config.eval_during_training or self._splits.validation is None):
      self._writer.write_scalars(int(jax.device_get(state.step)),
                                 _eval_scalars('eval', result))
    return result

  def _final(self, state: state_lib.TrainState,
             ckpt: checkpointer.Checkpointer) -> dict:
    step = int(jax.device_get(state.step))
    if self._splits.validation is None or not self.tracker.best_step:
      result = (self._last[1] if self._last and self._last[0] == step else
                self._score(step, state, ckpt))
      return {**result, 'step': step}
    best, loss = self.tracker.best_step, self.tracker.best_loss
    best_state = (state if best == step else self.best_state)
    if best_state is None:  # a resumed run: read the best checkpoint back
      restored = ckpt.restore_best(state_lib.abstract_state(
          self._setup.arch, self._setup.tx, self._setup.mesh))
      if restored is None:  # every best was damaged: the model is the last
        logging.warning('No best checkpoint is left; the model is the '
                        'state of step %d.', step)
        return {**self._score(step, state, ckpt), 'step': step}
      best, best_state, loss = restored
    result = {**self._score(best, best_state, ckpt), 'step': best,
              'val_loss': loss}
    if best_state.num_members > 1:
      result['members'] = inference.members_summary(best_state,
                                                   self._hparams)
    weights = inference.ridge_weights(
        best_state, self._splits.train.target_names)
    if weights is not None:
      result['ridge_weight'] = weights
    return result

  def _validate(self, step: int, state: state_lib.TrainState) -> dict:
    """The validation metrics of `state`, its members chosen (`_choose`);
    kept as the latest estimate."""
    result = (self._out_of_fold if self._folds > 1 else
              self._evaluate(state, self._splits.validation))
    self._latest = reading.estimate(step, result, self._folds)
    return result

  def _score(self, step: int, state: state_lib.TrainState,
             ckpt: checkpointer.Checkpointer) -> dict:
    """`state`'s metrics on the eval split; without one, the estimate of
    its error: the validation metrics recorded at `step` (in memory, or in
    its checkpoint for a resumed run), else those of its state again."""
    if self._splits.eval is not None:
      return self._evaluate(state, self._splits.eval)
    known = next((e for e in (self._best, self._latest)
                  if e and e['step'] == step), None) or _recorded(ckpt, step)
    if known is None:
      self._validate(step, with_choice(state, self._choose(step, state),
                                       self._setup))
      known = self._latest
    return {k: v for k, v in known.items() if k != 'step'}


def with_choice(state: state_lib.TrainState, choice: selection.Choice,
                setup: Setup) -> state_lib.TrainState:
  """`state` with the members' weights `choice` gives them (and, with ridge
  parts, their weight in the blend).

  Args:
    state: a train state placed by `setup.shardings`.
    choice: what an evaluation chose on the validation rows.
    setup: the run's setup (its shardings and mesh place the weights).

  Returns:
    A new state; `state` is unchanged.
  """
  if choice.ridge_weight_T is not None:
    state = ridge_fit.with_weight(state, choice.ridge_weight_T,
                                  setup.shardings)
  return state.replace(weights_M=jax.device_put(
      choice.weights_M, sharding.member_sharding(setup.mesh)))


def scored_on(result: dict) -> str:
  """What `result` was scored on, in words: 'eval', or the estimate."""
  return {reading.OUT_OF_FOLD: 'out-of-fold estimate (no eval file)',
          reading.HELD_OUT: 'held-out estimate (no eval file)'}.get(
              result.get('split'), 'eval')


def _recorded(ckpt: checkpointer.Checkpointer, step: int) -> dict | None:
  """The estimate the checkpoint of `step` recorded of its own state."""
  try:
    return reading.recorded_estimate(ckpt.restore_meta(step), step)
  except checkpointer.DamagedCheckpointError:
    return None


def _eval_scalars(prefix: str, result: dict) -> dict[str, float]:
  """The scalars of an evaluation: overall values, then each target's."""
  scalars = {f'{prefix}/{k}': result[k] for k in ('mse', 'rmse', 'mae', 'r2')}
  for target, values in result['targets'].items():
    scalars.update({f'{prefix}/{k}/{target}': values[k]
                    for k in ('rmse', 'mae', 'r2')})
  return scalars
