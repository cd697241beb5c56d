"""The mixture of members: moments, density, CDF, quantiles, coverage."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

from meshfit.model import uncertainty

M, B, T = 3, 5, 2


@pytest.fixture
def mixture():
  rng = np.random.default_rng(0)
  mean = rng.normal(size=(M, B, T)).astype(np.float32)
  var = rng.uniform(0.2, 2.0, size=(M, B, T)).astype(np.float32)
  weights = np.array([0.5, 0.3, 0.2], np.float32)
  w = uncertainty.member_weights(jnp.asarray(weights), mean, var)
  return weights, w, mean, var


def _scipy_cdf(weights, mean, var, z):
  return sum(w * scipy_stats.norm.cdf(z, m, np.sqrt(v))
             for w, m, v in zip(weights, mean, var))


def test_moments_are_the_law_of_total_variance(mixture):
  weights, w, mean, var = mixture
  got_mean, got_var = uncertainty.mixture_moments(w, mean, var)
  w3 = weights[:, None, None]
  expected_mean = (w3 * mean).sum(0)
  expected_var = (w3 * (var + mean**2)).sum(0) - expected_mean**2
  np.testing.assert_allclose(got_mean, expected_mean, rtol=1e-5)
  np.testing.assert_allclose(got_var, expected_var, rtol=1e-4)


def test_density_and_cdf_match_scipy(mixture):
  weights, w, mean, var = mixture
  z = np.linspace(-2, 2, B * T).reshape(B, T).astype(np.float32)
  density = sum(wi * scipy_stats.norm.pdf(z, m, np.sqrt(v))
                for wi, m, v in zip(weights, mean, var))
  np.testing.assert_allclose(
      uncertainty.mixture_log_density(w, mean, var, z), np.log(density),
      rtol=1e-5)
  np.testing.assert_allclose(uncertainty.mixture_cdf(w, mean, var, z),
                             _scipy_cdf(weights, mean, var, z), atol=1e-6)


@pytest.mark.parametrize('q', [0.05, 0.5, 0.95])
def test_quantile_inverts_the_cdf(mixture, q):
  weights, w, mean, var = mixture
  x = jax.jit(uncertainty.mixture_quantile)(w, mean, var, q)
  np.testing.assert_allclose(_scipy_cdf(weights, mean, var, np.asarray(x)),
                             q, atol=1e-5)


def test_one_member_quantile_is_the_normal_one():
  mean = np.array([[[1.0]]], np.float32)
  var = np.array([[[4.0]]], np.float32)
  w = uncertainty.member_weights(jnp.ones(1), mean, var)
  x = uncertainty.mixture_quantile(w, mean, var, 0.95)
  np.testing.assert_allclose(x, 1.0 + 2.0 * 1.6448536, rtol=1e-5)


def test_a_diverged_member_is_left_out_and_the_rest_renormalised(mixture):
  weights, _, mean, var = mixture
  mean = mean.copy()
  mean[1] = np.nan
  w = uncertainty.member_weights(jnp.asarray(weights), mean, var)
  np.testing.assert_allclose(w[:, 0, 0], [0.5 / 0.7, 0.0, 0.2 / 0.7],
                             rtol=1e-6)
  got, _ = uncertainty.mixture_moments(w, mean, var)
  assert np.isfinite(got).all()
  np.testing.assert_allclose(
      got, (0.5 * mean[0] + 0.2 * mean[2]) / 0.7, rtol=1e-5)


def test_gaussian_loss_is_the_nll_and_beta_weights_it():
  z = np.array([[0.5, -1.0]], np.float32)
  out = np.array([[0.0, 0.0, 0.3, -0.2]], np.float32)  # means, raw variances
  var = np.log1p(np.exp(out[:, 2:])) + uncertainty.MIN_VARIANCE
  nll = -scipy_stats.norm.logpdf(z, 0.0, np.sqrt(var))
  np.testing.assert_allclose(
      uncertainty.member_loss(out, z, 'gaussian'), nll.mean(), rtol=1e-5)
  np.testing.assert_allclose(
      uncertainty.member_loss(out, z, 'gaussian', 0.5),
      (nll * var**0.5).mean(), rtol=1e-5)
  np.testing.assert_allclose(
      uncertainty.member_loss(out[:, :2], z, 'squared_error'),
      np.mean(z**2), rtol=1e-6)


def test_coverage_counts_values_inside_each_central_interval():
  pit = jnp.array([[0.5], [0.76], [0.96], [0.001]])
  covered = np.asarray(uncertainty.covered_LxBxT(pit))[:, :, 0]
  level = {lvl: i for i, lvl in enumerate(uncertainty.COVERAGE_LEVELS)}
  assert covered[level[0.5]].tolist() == [True, False, False, False]
  assert covered[level[0.95]].tolist() == [True, True, True, False]
  assert covered[level[0.99]].tolist() == [True, True, True, False]
