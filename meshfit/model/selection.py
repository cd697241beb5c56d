"""Which members make the model: chosen on the validation rows.

Every member is scored on the rows held out of the training file, and
`sweep.select` decides the weights of the ensemble's prediction:

  all     every member alike (those whose outputs are finite)
  best    the single best member
  greedy  Caruana et al. (2004)'s ensemble selection: starting from none,
          add (with replacement) the member that most improves the
          ensemble, and keep the best ensemble seen; a member chosen twice
          weighs twice as much.

The loss is the training loss's, in standardised units averaged over the
targets: the mean squared error of the ensemble's mean, or, for a model that
predicts a distribution, the mixture's negative log-likelihood. Computed on
the host in float64 from every member's predictions.

Cross-fitted members (`dataset.validation` = F folds: member m held out
fold m % F) are chosen a *bag* at a time: bag b is members bF .. bF+F-1, one
per fold, and each validation row is scored by the member of the bag that
held it out (out of fold). A bag's weight is shared by its F members.
"""

import dataclasses
import math

import numpy as np

# Greedy selection adds at most this many members (with replacement), and
# stops after GREEDY_PATIENCE additions in a row that did not improve on
# the best ensemble; Caruana et al. saw the gain level off well within a
# hundred.
MAX_GREEDY_ROUNDS = 100
GREEDY_PATIENCE = 10


@dataclasses.dataclass(frozen=True)
class Choice:
  """The members chosen, and the numbers that chose them.

  Attributes:
    select: 'all', 'best' or 'greedy'.
    weights_M: each member's weight (they sum to 1).
    loss: the validation loss of the chosen ensemble.
    member_losses_M: each member's own validation loss (inf: diverged);
      with folds, its bag's out-of-fold loss.
    all_loss: the loss of every finite member alike.
    folds: the members of a bag (1: members are chosen one by one).
    ridge_weight_T: with ridge parts (`blend`), their weight in the
      members' predictions per target; `loss` is then the blend's.
    network_loss: with ridge parts, the networks' own loss, by which the
      step is chosen (else None: `loss` chooses it).
  """
  select: str
  weights_M: np.ndarray
  loss: float
  member_losses_M: np.ndarray
  all_loss: float
  folds: int = 1
  ridge_weight_T: np.ndarray | None = None
  network_loss: float | None = None

  @property
  def step_loss(self) -> float:
    """The loss that ranks the steps: the networks' own, so that they
    train and stop as they would without ridge parts."""
    return self.loss if self.network_loss is None else self.network_loss

  @property
  def best_member(self) -> int:
    return int(np.argmin(self.member_losses_M))

  def chosen(self) -> dict[int, float]:
    """{member: weight} of the members with a weight."""
    return {int(m): float(self.weights_M[m])
            for m in np.flatnonzero(self.weights_M > 0)}

  def describe(self, hyperparameters=None) -> str:
    """One line: what was chosen, how it compares, and the chosen members'
    hyperparameters (those that differ between members)."""
    members, f = len(self.weights_M), self.folds
    chosen = self.chosen()
    if f > 1:  # a bag's members share its weight: name the bag's first
      chosen = {m: w * f for m, w in chosen.items() if m % f == 0}
    unit = (lambda m: f'{m}-{m + f - 1}') if f > 1 else str
    what = {'all': f'all {members} members alike',
            'best': f'member{"s" if f > 1 else ""} {unit(self.best_member)}'
                    f' of {members}',
            'greedy': 'members ' + ', '.join(
                f'{unit(m)} ({w:.0%})' for m, w in chosen.items())
                      + f' of {members}'}[self.select]
    line = (f'{self.select} selection: {what}, validation loss '
            f'{self.loss:.6g} (best {"bag" if f > 1 else "member"} '
            f'{unit(self.best_member)}: '
            f'{self.member_losses_M[self.best_member]:.6g}; all alike: '
            f'{self.all_loss:.6g})')
    if self.ridge_weight_T is not None:
      line += ('; ridge part ' + '/'.join(f'{w:.0%}'
                                          for w in self.ridge_weight_T)
               + ' of the prediction')
    varying = [] if hyperparameters is None else hyperparameters.varying()
    if varying and self.select != 'all':
      line += '; ' + '; '.join(
          f'member {m}: ' + ', '.join(
              f'{k}={v:.3g}' for k, v in hyperparameters.member(m).items()
              if k in varying)
          for m in chosen)
    return line

  def to_json(self) -> dict:
    return {'select': self.select,
            'members': {str(m): w for m, w in self.chosen().items()},
            'validation_loss': self.loss,
            'best_member': self.best_member,
            'best_member_loss': float(self.member_losses_M[self.best_member]),
            'all_members_loss': self.all_loss,
            **({'ridge_weight': [float(w) for w in self.ridge_weight_T]}
               if self.ridge_weight_T is not None else {})}


def _log_density(mean, var, z):
  return -0.5 * (np.log(2 * np.pi * var) + (z - mean)**2 / var)


class _Scorer:
  """Losses of weighted ensembles of the members (float64)."""

  def __init__(self, mean_MxNxT: np.ndarray, var_MxNxT: np.ndarray,
               z_NxT: np.ndarray, distribution: bool):
    self.distribution = distribution
    self.mean = mean_MxNxT.astype(np.float64)
    self.z = z_NxT.astype(np.float64)
    with np.errstate(all='ignore'):
      finite = (np.isfinite(self.mean).all(axis=(1, 2))
                & np.isfinite(var_MxNxT).all(axis=(1, 2)))
      if distribution:
        self.log_p = _log_density(self.mean, var_MxNxT.astype(np.float64),
                                  self.z[None])
        finite &= np.isfinite(self.log_p).all(axis=(1, 2))
    self.finite_M = finite

  def of_sum(self, total, count):
    """The loss of the ensemble whose sum of statistics over `count`
    members (with repeats) is `total` (vectorised over leading axes)."""
    if self.distribution:  # total: log of the summed densities
      return -np.mean(total - np.log(count), axis=(-2, -1))
    return np.mean(np.mean((total / count - self.z)**2, axis=-2), axis=-1)

  def member_stats(self):
    """Each member's statistic, summed across an ensemble."""
    return self.log_p if self.distribution else self.mean

  def add(self, total, stats):
    if self.distribution:
      return np.logaddexp(total, stats)
    return total + stats

  def of_weights(self, weights_M: np.ndarray) -> float:
    used = weights_M > 0
    if not used.any():
      return math.inf
    w = weights_M[used] / weights_M[used].sum()
    stats = self.member_stats()[used]
    if self.distribution:
      return float(-np.mean(_log_weighted_sum(w, stats)))
    return float(self.of_sum(np.tensordot(w, stats, axes=1), 1.0))


def _log_weighted_sum(w_M: np.ndarray, x_MxNxT: np.ndarray) -> np.ndarray:
  """log(sum over m of w_M[m] * exp(x_MxNxT[m])), the weights positive:
  scipy.special.logsumexp(x, axis=0, b=w), without scipy's import (0.1 s of
  a small run)."""
  x_MxNxT = x_MxNxT + np.log(w_M)[:, None, None]
  top_NxT = np.max(x_MxNxT, axis=0)
  top_NxT = np.where(np.isfinite(top_NxT), top_NxT, 0.0)  # all -inf: -inf
  with np.errstate(divide='ignore'):
    return top_NxT + np.log(np.sum(np.exp(x_MxNxT - top_NxT), axis=0))


def out_of_fold(a_MxNxT: np.ndarray, fold_N: np.ndarray,
                folds: int) -> np.ndarray:
  """Each bag's outputs, every row from the member that held it out:
  a_BxNxT[b, i] = a_MxNxT[b * folds + fold_N[i], i]."""
  members, n = a_MxNxT.shape[:2]
  bags = members // folds
  member_BxN = np.arange(bags)[:, None] * folds + fold_N[None]
  return a_MxNxT[member_BxN, np.arange(n)[None]]


def choose(select: str, mean_MxNxT: np.ndarray, var_MxNxT: np.ndarray,
           z_NxT: np.ndarray, distribution: bool,
           fold_N: np.ndarray | None = None, folds: int = 1) -> Choice:
  """The weights of the members by `select`, from their validation outputs.

  Args:
    select: 'all', 'best' or 'greedy'.
    mean_MxNxT: each member's predicted means (standardised units).
    var_MxNxT: their variances (0 without a distribution).
    z_NxT: the standardised validation targets.
    distribution: score the mixture's NLL, not the mean's squared error.
    fold_N: with folds, the fold of each validation row.
    folds: F > 1: members are cross-fitted (m held out fold m % F) and
      chosen in bags of F, out of fold.
  """
  if folds > 1:
    bags = choose(select, out_of_fold(mean_MxNxT, fold_N, folds),
                  out_of_fold(var_MxNxT, fold_N, folds), z_NxT, distribution)
    return dataclasses.replace(
        bags, weights_M=np.repeat(bags.weights_M / folds, folds),
        member_losses_M=np.repeat(bags.member_losses_M, folds), folds=folds)
  scorer = _Scorer(mean_MxNxT, var_MxNxT, z_NxT, distribution)
  members = len(scorer.finite_M)
  stats = scorer.member_stats()
  losses = np.full(members, math.inf)
  for m in np.flatnonzero(scorer.finite_M):
    losses[m] = scorer.of_sum(stats[m], 1.0)
  alike = scorer.finite_M.astype(np.float64)
  if not alike.any():  # every member diverged: nothing to choose
    alike[:] = 1.0
  alike /= alike.sum()
  all_loss = scorer.of_weights(alike)
  if select == 'all':
    weights, loss = alike, all_loss
  elif select == 'best':
    weights = np.zeros(members)
    weights[int(np.argmin(losses))] = 1.0
    loss = float(np.min(losses))
  else:
    weights, loss = _greedy(scorer, losses)
  return Choice(select, weights.astype(np.float32), float(loss), losses,
                float(all_loss))


def blend(choice: Choice, network_MxNxT: np.ndarray,
          ridge_MxNxT: np.ndarray, z_NxT: np.ndarray,
          fold_N: np.ndarray | None = None, folds: int = 1,
          spread_T: np.ndarray | None = None) -> Choice:
  """`choice` with its members' ridge parts weighed against their networks.

  Each target's weight is the w in [0, 1] that minimises the expected
  squared error of the prediction, d + w (r - d), where d is the chosen
  networks' average and r their ridge parts'. It is quadratic in w, given
  E(z - d)^2, E(z - d)(z - r) and E(z - r)^2:

  - held-out rows are scored by every member, so the three are read off
    them (the line search of the blend on those rows);
  - cross-fitted rows (`folds`) are each scored by one member, whose error
    is the ensemble's plus the members' spread (the ambiguity
    decomposition, Krogh and Vedelsby 1995: mean_m (z - d_m)^2 =
    (z - d)^2 + mean_m (d_m - d)^2). So E(z - d)^2 is the members' own
    out-of-fold error less `spread_T`, their spread on rows none of them
    trained on (`spread`); the other two are linear in d and read off the
    rows as they are (the ridge parts' spread, kept, counts against them).
    Without `spread_T` the weight is what a spread of 0 gives, an upper
    bound: the weight only falls as the spread rises, so a 0 is final.

  The choice's loss becomes the blend's on the validation rows (out of fold
  with folds), and its `network_loss` keeps the networks' own.

  Args:
    choice: the members chosen on their networks' outputs (`choose`).
    network_MxNxT: each member's network (standardised units).
    ridge_MxNxT: each member's ridge part.
    z_NxT: the standardised validation targets.
    fold_N: with folds, the fold of each validation row.
    folds: as in `choose`.
    spread_T: with folds, `spread` of the chosen networks.
  """
  weights_M = choice.weights_M.astype(np.float64)
  if folds > 1:
    network_MxNxT = out_of_fold(network_MxNxT, fold_N, folds)
    ridge_MxNxT = out_of_fold(ridge_MxNxT, fold_N, folds)
    weights_M = weights_M[::folds] * folds
  used = weights_M > 0  # a diverged member's NaN must not reach the sums
  network_UxNxT = network_MxNxT[used].astype(np.float64)
  d_NxT = np.tensordot(weights_M[used], network_UxNxT, axes=1)
  r_NxT = np.tensordot(weights_M[used], ridge_MxNxT[used].astype(
      np.float64), axes=1)
  z_NxT = z_NxT.astype(np.float64)
  if folds > 1:  # the members' own error, less their spread
    network_T = np.mean(np.tensordot(
        weights_M[used], (network_UxNxT - z_NxT[None])**2, axes=1), axis=0)
    network_T = network_T - (0.0 if spread_T is None else spread_T)
  else:
    network_T = np.mean((d_NxT - z_NxT)**2, axis=0)
  cross_T = np.mean((z_NxT - d_NxT) * (z_NxT - r_NxT), axis=0)
  ridge_T = np.mean((z_NxT - r_NxT)**2, axis=0)
  # E(d + w (r - d) - z)^2 = network - 2 w (network - cross) + w^2 curve.
  curve_T = network_T - 2 * cross_T + ridge_T
  with np.errstate(all='ignore'):
    weight_T = np.where(curve_T > 0, (network_T - cross_T) / curve_T,
                        (ridge_T < network_T).astype(np.float64))
  weight_T = np.clip(np.nan_to_num(weight_T), 0.0, 1.0)
  loss = float(np.mean(np.mean((d_NxT + weight_T * (r_NxT - d_NxT)
                                - z_NxT)**2, axis=0)))
  return dataclasses.replace(choice, loss=loss, ridge_weight_T=weight_T,
                             network_loss=choice.loss)


def unblended(choice: Choice, targets: int) -> Choice:
  """`choice` with its members' ridge parts at weight 0 (its loss the
  networks')."""
  return dataclasses.replace(choice, ridge_weight_T=np.zeros(targets),
                             network_loss=choice.loss)


def spread(weights_M: np.ndarray, network_MxNxT: np.ndarray,
           z_NxT: np.ndarray, fold_N: np.ndarray, folds: int) -> np.ndarray:
  """The cross-fitted members' spread, sum_m w_m (d_m - d)^2 (d = sum_m
  w_m d_m), estimated for rows none of them trained on, per target.

  It is sum over pairs of w_a w_b E(d_a - d_b)^2, and with errors e = d - z,
  E(e_a - e_b)^2 = E e_a^2 + E e_b^2 - 2 E e_a e_b. Each member's E e^2 is
  its error out of fold; E e_a e_b is measured on the rows that either
  member held out. Where both did (members of two bags, one fold) that is
  exact; where one did, the other trained on the row and has fitted part of
  its error, the share it has in common with the first included, so the
  product understates the pair's common error and the spread is
  overstated: the networks' average is rated no worse than it is, and the
  ridge part weighed against it gets no more than its due.

  Args:
    weights_M: the members' weights in the ensemble (`Choice.weights_M`).
    network_MxNxT: every member's network on every validation row.
    z_NxT: the standardised validation targets.
    fold_N: the fold of each validation row (member m held out m % folds).
    folds: F.
  """
  used = np.flatnonzero(weights_M > 0)
  w_U = weights_M[used].astype(np.float64) / weights_M[used].sum()
  held_UxN = fold_N[None] == (used % folds)[:, None]
  error_UxNxT = (network_MxNxT[used].astype(np.float64)
                 - z_NxT.astype(np.float64)[None])
  own_UxT = np.stack([np.mean(error_UxNxT[u, held_UxN[u]]**2, axis=0)
                      for u in range(len(used))])
  total_T = np.zeros(z_NxT.shape[1])
  for a in range(len(used)):
    for b in range(a + 1, len(used)):
      rows = held_UxN[a] | held_UxN[b]
      common_T = np.mean(error_UxNxT[a, rows] * error_UxNxT[b, rows], axis=0)
      total_T += w_U[a] * w_U[b] * np.maximum(
          own_UxT[a] + own_UxT[b] - 2 * common_T, 0.0)
  return total_T


def _greedy(scorer: _Scorer, losses_M: np.ndarray
            ) -> tuple[np.ndarray, float]:
  """Caruana's forward selection with replacement; the best bag seen."""
  members = len(losses_M)
  stats = scorer.member_stats()
  ok = scorer.finite_M
  counts = np.zeros(members)
  first = int(np.argmin(losses_M))
  counts[first], total = 1, stats[first]
  best_counts, best_loss = counts.copy(), float(losses_M[first])
  since_best = 0
  for size in range(2, MAX_GREEDY_ROUNDS + 1):
    candidates = scorer.of_sum(scorer.add(total[None], stats), float(size))
    candidates = np.where(ok, candidates, math.inf)
    m = int(np.argmin(candidates))
    counts[m] += 1
    total = scorer.add(total, stats[m])
    if candidates[m] < best_loss - 1e-12:
      best_counts, best_loss, since_best = counts.copy(), float(candidates[m]), 0
    else:
      since_best += 1
      if since_best >= GREEDY_PATIENCE:
        break
  return best_counts / best_counts.sum(), best_loss
