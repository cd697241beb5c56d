"""Choosing an ensemble's members on validation rows."""

import math

import numpy as np
import pytest

from meshfit.model import optim, selection

N, T = 400, 1


def _members(noise_scales, seed=0):
  """Members predicting z plus independent noise of the given scales."""
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(N, T))
  mean = np.stack([z + s * rng.normal(size=(N, T)) for s in noise_scales])
  return mean.astype(np.float32), np.zeros_like(mean), z.astype(np.float32)


def test_best_picks_the_lowest_loss():
  mean, var, z = _members([0.5, 0.1, 0.3])
  choice = selection.choose('best', mean, var, z, distribution=False)
  assert choice.chosen() == {1: 1.0}
  assert choice.loss == pytest.approx(choice.member_losses_M[1])
  np.testing.assert_allclose(choice.member_losses_M,
                             np.mean((mean - z)**2, axis=(1, 2)), rtol=1e-5)


def test_all_weighs_every_member_alike():
  mean, var, z = _members([0.5, 0.1, 0.3])
  choice = selection.choose('all', mean, var, z, distribution=False)
  np.testing.assert_allclose(choice.weights_M, [1 / 3] * 3, rtol=1e-6)
  assert choice.loss == pytest.approx(
      np.mean((mean.mean(axis=0) - z)**2), rel=1e-5)


def test_greedy_averages_good_members_and_leaves_a_bad_one_out():
  # Four members with independent errors: their average beats each; a
  # fifth, far worse, only hurts.
  mean, var, z = _members([0.3, 0.3, 0.3, 0.3, 3.0])
  choice = selection.choose('greedy', mean, var, z, distribution=False)
  assert 4 not in choice.chosen()
  assert len(choice.chosen()) >= 3
  assert choice.loss < choice.member_losses_M.min()
  assert choice.loss <= choice.all_loss
  assert choice.weights_M.sum() == pytest.approx(1.0)
  # The loss reported is the chosen weights' own.
  ensemble = np.tensordot(choice.weights_M, mean, axes=1)
  assert choice.loss == pytest.approx(np.mean((ensemble - z)**2), rel=1e-4)


def test_greedy_scores_a_distribution_by_its_nll():
  rng = np.random.default_rng(1)
  z = rng.normal(size=(N, T)).astype(np.float32)
  mean = np.zeros((3, N, T), np.float32)
  # Member 0 is calibrated (unit variance); 1 and 2 are over-confident.
  var = np.stack([np.ones((N, T)), np.full((N, T), 0.05),
                  np.full((N, T), 0.1)]).astype(np.float32)
  choice = selection.choose('greedy', mean, var, z, distribution=True)
  nll0 = np.mean(0.5 * np.log(2 * np.pi) + 0.5 * z**2)
  assert choice.member_losses_M[0] == pytest.approx(nll0, rel=1e-5)
  assert choice.best_member == 0
  assert choice.loss <= choice.member_losses_M[0] + 1e-9


def test_diverged_members_are_never_chosen():
  mean, var, z = _members([0.5, 0.1, 0.3])
  mean[1] = np.nan
  for select in ('best', 'greedy', 'all'):
    choice = selection.choose(select, mean, var, z, distribution=False)
    assert 1 not in choice.chosen(), select
    assert math.isinf(choice.member_losses_M[1])
    assert math.isfinite(choice.loss)


def test_the_choice_says_what_was_chosen_and_why():
  mean, var, z = _members([0.5, 0.1, 0.3, 0.2])
  hparams = optim.Hyperparameters(
      np.array([1e-3, 1e-2, 1e-3, 1e-2], np.float32),
      np.zeros(4, np.float32), np.zeros(4, np.float32))
  line = selection.choose('best', mean, var, z, False).describe(hparams)
  assert line.startswith('best selection: member 1 of 4, validation loss ')
  assert 'member 1: learning_rate=0.01' in line
  assert 'weight_decay' not in line  # the same for every member
  record = selection.choose('greedy', mean, var, z, False).to_json()
  assert record['select'] == 'greedy' and record['best_member'] == 1
  assert sum(record['members'].values()) == pytest.approx(1.0)


def test_cross_fitted_members_are_scored_out_of_fold_and_chosen_in_bags():
  # Two bags of three folds: members 0-2 and 3-5. Each member predicts its
  # own fold's rows well only if its bag is good, and every other row
  # (the ones it trained on) perfectly, which must not count.
  rng = np.random.default_rng(0)
  z = rng.normal(size=(N, T)).astype(np.float32)
  fold_N = rng.integers(0, 3, N)
  mean = np.repeat(z[None], 6, axis=0)
  for m, scale in enumerate([0.1, 0.1, 0.1, 0.5, 0.5, 0.5]):
    own = fold_N == m % 3
    mean[m, own] += scale * rng.normal(size=(own.sum(), T))
  var = np.zeros_like(mean)
  choice = selection.choose('best', mean, var, z, False, fold_N, folds=3)
  assert choice.chosen() == pytest.approx({0: 1 / 3, 1: 1 / 3, 2: 1 / 3})
  out_of_fold = selection.out_of_fold(mean, fold_N, 3)
  assert out_of_fold.shape == (2, N, T)
  np.testing.assert_array_equal(out_of_fold[1, fold_N == 2], mean[5, fold_N == 2])
  assert choice.loss == pytest.approx(np.mean((out_of_fold[0] - z)**2), rel=1e-5)
  assert choice.loss > 0.005  # in-fold, every member would score 0
  np.testing.assert_allclose(choice.member_losses_M[3:],
                             np.mean((out_of_fold[1] - z)**2), rtol=1e-5)
  line = choice.describe()
  assert 'members 0-2 of 6' in line and 'best bag 0-2' in line, line
  every = selection.choose('all', mean, var, z, False, fold_N, folds=3)
  np.testing.assert_allclose(every.weights_M, [1 / 6] * 6, rtol=1e-6)


def test_a_bag_with_a_diverged_member_is_left_out_whole():
  mean, var, z = _members([0.1, 0.1, 0.2, 0.2])
  mean[3] = np.nan  # member 3 (bag 1's second fold) diverged
  fold_N = np.arange(N) % 2
  choice = selection.choose('all', mean, var, z, False, fold_N, folds=2)
  np.testing.assert_allclose(choice.weights_M, [0.5, 0.5, 0, 0])
  assert math.isfinite(choice.loss)
  assert math.isinf(choice.member_losses_M[2])


def test_the_blend_weighs_ridge_parts_against_the_networks():
  rng = np.random.default_rng(1)
  z = rng.normal(size=(N, 2))
  network = z + 0.5 * rng.normal(size=(N, 2))
  ridge = z + 0.5 * rng.normal(size=(N, 2))
  # Target 0: the ridge parts are exact; target 1: the networks are.
  ridge[:, 0], network[:, 1] = z[:, 0], z[:, 1]
  mean, var = network[None].repeat(2, axis=0), np.zeros((2, N, 2))
  choice = selection.choose('all', mean, var, z, False)
  blended = selection.blend(choice, mean, ridge[None].repeat(2, axis=0), z)
  np.testing.assert_allclose(blended.ridge_weight_T, [1.0, 0.0], atol=1e-12)
  assert blended.loss == pytest.approx(0.0, abs=1e-12)
  assert choice.loss > 0.1  # the networks' own loss, before the blend
  # Two independent predictors, the ridge parts a little better: about
  # half each, and a lower loss than either alone (the line search's
  # minimum); the step is still ranked by the networks' own loss.
  network = z + 0.5 * rng.normal(size=(N, 2))
  ridge = z + 0.45 * rng.normal(size=(N, 2))
  blended = selection.blend(choice, network[None].repeat(2, axis=0),
                            ridge[None].repeat(2, axis=0), z)
  assert np.all(np.abs(blended.ridge_weight_T - 0.5) < 0.15)
  for alone in (network, ridge):
    assert blended.loss < np.mean((alone - z)**2)
  w = blended.ridge_weight_T
  assert blended.loss == pytest.approx(
      np.mean((network + w * (ridge - network) - z)**2))
  assert blended.step_loss == choice.loss > blended.loss
  assert blended.to_json()['ridge_weight'] == pytest.approx(list(w))
  assert 'ridge part ' in blended.describe()
  # Held-out rows are scored by every member, as a prediction is: the
  # line search stands even where the ridge parts alone are a little worse.
  ridge = z + 0.55 * rng.normal(size=(N, 2))
  worse = selection.blend(choice, network[None].repeat(2, axis=0),
                          ridge[None].repeat(2, axis=0), z)
  assert np.all(worse.ridge_weight_T > 0.25)
  assert worse.loss < np.mean((network - z)**2)


def test_the_blend_of_cross_fitted_members_is_weighed_out_of_fold():
  # Three folds, one bag. Each member's ridge part is exact on the rows
  # it trained on (which must not count) and noisy on its own fold; its
  # network the reverse, a little noisy on its own fold.
  rng = np.random.default_rng(2)
  z = rng.normal(size=(N, T))
  fold_N = rng.integers(0, 3, N)
  network = np.repeat(z[None], 3, axis=0) + 9.0
  ridge = np.repeat(z[None], 3, axis=0)
  for m in range(3):
    own = fold_N == m
    network[m, own] = z[own] + 0.1 * rng.normal(size=(own.sum(), T))
    ridge[m, own] = z[own] + 1.0 * rng.normal(size=(own.sum(), T))
  choice = selection.choose('all', network, np.zeros_like(network), z, False,
                            fold_N, folds=3)
  blended = selection.blend(choice, network, ridge, z, fold_N, folds=3)
  assert blended.ridge_weight_T[0] < 0.05
  assert blended.loss <= choice.loss < 0.02


def _cross_fitted(rng, rows, members, ridge_noise, network_noise=0.5,
                  label_noise=0.5, pull=0.2):
  """(z, fold, network_MxN, ridge_MxN, fresh): targets z, the truth plus
  `label_noise`; cross-fitted members m (fold m) whose networks err from
  the truth independently by `network_noise`, each pulled `pull` of the way
  to z on the rows it trained on; ridge parts alike in every member; and
  `fresh`, (z, networks, ridge part) on new rows that no member trained on,
  as a prediction meets them."""
  def draw(n, trained_MxN=None):
    truth = rng.normal(size=(n, 1))
    z = truth + label_noise * rng.normal(size=(n, 1))
    network = truth[None] + network_noise * rng.normal(size=(members, n, 1))
    if trained_MxN is not None:
      network = np.where(trained_MxN[:, :, None],
                         network + pull * (z[None] - network), network)
    ridge = truth + ridge_noise * rng.normal(size=(n, 1))
    return z, network, np.repeat(ridge[None], members, axis=0)
  fold_N = np.arange(rows) % members
  z, network, ridge = draw(
      rows, fold_N[None] != np.arange(members)[:, None])
  return z, fold_N, network, ridge, draw(4 * rows)


def test_cross_fitted_blend_is_weighed_against_the_networks_average():
  # Five networks, each out of fold as good as the ridge parts: one
  # network's rows give the ridge part about half, but a prediction
  # averages five independent networks, which it helps far less.
  rng = np.random.default_rng(3)
  z, fold_N, network, ridge, fresh = _cross_fitted(
      rng, 2000, 5, ridge_noise=0.5)
  choice = selection.choose('all', network, np.zeros_like(network), z, False,
                            fold_N, folds=5)
  one_network = selection.blend(choice, network, ridge, z, fold_N, 5)
  assert one_network.ridge_weight_T[0] == pytest.approx(0.5, abs=0.07)
  spread_T = selection.spread(choice.weights_M, network, z, fold_N, 5)
  # Five networks of error variance 0.25 spread by 4/5 of it; measured
  # beside members pulled towards the targets, a little more (the pull's
  # share of the label noise: 0.8 * 0.2 * 0.25).
  assert spread_T[0] == pytest.approx(0.2 + 0.04, abs=0.02)
  blended = selection.blend(choice, network, ridge, z, fold_N, 5, spread_T)
  fresh_z, fresh_network, fresh_ridge = fresh
  def fresh_loss(w):
    d = fresh_network.mean(axis=0)
    return np.mean((d + w * (fresh_ridge[0] - d) - fresh_z)**2)
  best = min(np.linspace(0, 1, 101), key=fresh_loss)
  # No more than its due: between none and the best weight for new rows.
  assert 0.1 < best < 0.3
  assert 0.0 <= blended.ridge_weight_T[0] <= best + 0.03
  assert fresh_loss(blended.ridge_weight_T[0]) < fresh_loss(
      one_network.ridge_weight_T[0])
  # A ridge part far better than five networks keeps nearly all of it.
  z, fold_N, network, ridge, _ = _cross_fitted(rng, 2000, 5,
                                               ridge_noise=0.05)
  spread_T = selection.spread(choice.weights_M, network, z, fold_N, 5)
  assert selection.blend(choice, network, ridge, z, fold_N, 5,
                         spread_T).ridge_weight_T[0] > 0.9


def test_log_weighted_sum_is_scipys_logsumexp():
  from scipy.special import logsumexp  # noqa: PLC0415  (the reference only)
  rng = np.random.default_rng(0)
  for members in (1, 3, 8):
    x = rng.normal(size=(members, 40, 2)) * 30
    w = rng.random(members) + 0.01
    w /= w.sum()
    np.testing.assert_allclose(selection._log_weighted_sum(w, x),
                               logsumexp(x, axis=0, b=w[:, None, None]),
                               rtol=1e-13, atol=1e-12)
  all_minus_inf = np.full((3, 2, 1), -np.inf)
  assert np.all(selection._log_weighted_sum(np.full(3, 1 / 3), all_minus_inf)
                == -np.inf)
