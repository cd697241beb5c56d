"""Members' outputs as distributions, and the ensemble as their mixture.

With `model.likelihood='gaussian'` each member's head predicts, per target,
a mean and a raw value whose softplus is the variance, both in standardised
units; training minimises the Gaussian negative log-likelihood (optionally
beta-NLL, Seitzer et al. 2022). With 'squared_error' a member predicts a
value and no variance. The ensemble's prediction is the weighted mixture of
its members (Lakshminarayanan et al. 2017): its mean, variance, density,
CDF and quantiles are computed here, on device, in standardised units;
callers turn them into the targets' units.

A member whose outputs are not finite (one that diverged in a sweep) is
left out of the mixture, row by row, and the others' weights renormalised.
"""

import math

import jax
import jax.numpy as jnp

# Added to every predicted variance (standardised units): keeps the NLL
# finite where a member grows too sure of itself.
MIN_VARIANCE = 1e-6
# Central intervals whose coverage eval reports; the calibration plot draws
# every one of them.
COVERAGE_LEVELS = tuple(round(0.05 * i, 2) for i in range(1, 20)) + (0.99,)
REPORTED_COVERAGE = (0.5, 0.9, 0.95)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
# Bisection steps of `mixture_quantile`: the bracket shrinks below float32
# resolution well before this.
_QUANTILE_ITERATIONS = 64


def split_outputs(out_BxO: jax.Array, likelihood: str
                  ) -> tuple[jax.Array, jax.Array]:
  """(mean_BxT, var_BxT) of a member's head (var 0 for squared_error)."""
  if likelihood == 'squared_error':
    return out_BxO, jnp.zeros_like(out_BxO)
  mean, raw = jnp.split(out_BxO, 2, axis=-1)
  return mean, jax.nn.softplus(raw) + MIN_VARIANCE


def member_loss(out_BxO: jax.Array, z_BxT: jax.Array, likelihood: str,
                nll_beta: float = 0.0) -> jax.Array:
  """A member's training loss on standardised targets (a scalar).

  squared_error: the mean squared error. gaussian: the mean negative
  log-likelihood, each element weighted by its variance ** nll_beta with
  no gradient through the weight (beta-NLL; 0 is plain NLL).
  """
  mean, var = split_outputs(out_BxO, likelihood)
  if likelihood == 'squared_error':
    return jnp.mean((mean - z_BxT)**2)
  nll = _HALF_LOG_2PI + 0.5 * (jnp.log(var) + (z_BxT - mean)**2 / var)
  if nll_beta:
    nll = nll * jax.lax.stop_gradient(var)**nll_beta
  return jnp.mean(nll)


def member_weights(weights_M: jax.Array, mean_MxBxT: jax.Array,
                   var_MxBxT: jax.Array) -> jax.Array:
  """w_MxBxT: each member's weight, 0 where its outputs are not finite, the
  rest renormalised (NaN where no member is left)."""
  ok = (jnp.isfinite(mean_MxBxT) & jnp.isfinite(var_MxBxT)
        & (weights_M[:, None, None] > 0))
  w = jnp.where(ok, weights_M[:, None, None], 0.0)
  return w / jnp.sum(w, axis=0, keepdims=True)


def _clean(w_MxBxT, a_MxBxT):
  """`a` where a member counts, 0 elsewhere (0 * NaN would be NaN)."""
  return jnp.where(w_MxBxT > 0, a_MxBxT, 0.0)


def mixture_moments(w_MxBxT: jax.Array, mean_MxBxT: jax.Array,
                    var_MxBxT: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(mean_BxT, var_BxT) of the mixture: the law of total variance."""
  mean_m, var_m = _clean(w_MxBxT, mean_MxBxT), _clean(w_MxBxT, var_MxBxT)
  mean = jnp.sum(w_MxBxT * mean_m, axis=0)
  spread = (mean_m - mean[None])**2
  return mean, jnp.sum(w_MxBxT * (var_m + spread), axis=0)


def mixture_log_density(w_MxBxT: jax.Array, mean_MxBxT: jax.Array,
                        var_MxBxT: jax.Array, z_BxT: jax.Array) -> jax.Array:
  """log p(z) under the mixture, per element (standardised units)."""
  mean_m = _clean(w_MxBxT, mean_MxBxT)
  var_m = jnp.where(w_MxBxT > 0, var_MxBxT, 1.0)
  log_p = -_HALF_LOG_2PI - 0.5 * (jnp.log(var_m)
                                  + (z_BxT[None] - mean_m)**2 / var_m)
  return jax.scipy.special.logsumexp(log_p, axis=0, b=w_MxBxT)


def mixture_cdf(w_MxBxT: jax.Array, mean_MxBxT: jax.Array,
                var_MxBxT: jax.Array, z_BxT: jax.Array) -> jax.Array:
  """P(Z <= z) under the mixture, per element."""
  mean_m = _clean(w_MxBxT, mean_MxBxT)
  std_m = jnp.sqrt(jnp.where(w_MxBxT > 0, var_MxBxT, 1.0))
  return jnp.sum(w_MxBxT * jax.scipy.stats.norm.cdf(
      (z_BxT[None] - mean_m) / std_m), axis=0)


def mixture_quantile(w_MxBxT: jax.Array, mean_MxBxT: jax.Array,
                     var_MxBxT: jax.Array, q: jax.Array | float
                     ) -> jax.Array:
  """The q-quantile of the mixture, per element, by bisection on its CDF.

  The quantile lies between the members' own q-quantiles, so those bracket
  it; each step halves the bracket.
  """
  mean_m = _clean(w_MxBxT, mean_MxBxT)
  std_m = jnp.sqrt(jnp.where(w_MxBxT > 0, var_MxBxT, 0.0))
  own = mean_m + std_m * jax.scipy.special.ndtri(q)
  used = w_MxBxT > 0
  lo = jnp.min(jnp.where(used, own, jnp.inf), axis=0)
  hi = jnp.max(jnp.where(used, own, -jnp.inf), axis=0)

  def halve(_, bracket):
    lo, hi = bracket
    mid = 0.5 * (lo + hi)
    below = mixture_cdf(w_MxBxT, mean_MxBxT, var_MxBxT, mid) < q
    return jnp.where(below, mid, lo), jnp.where(below, hi, mid)
  lo, hi = jax.lax.fori_loop(0, _QUANTILE_ITERATIONS, halve, (lo, hi))
  return 0.5 * (lo + hi)


def covered_LxBxT(pit_BxT: jax.Array) -> jax.Array:
  """Whether each value lies in the central interval of each of
  COVERAGE_LEVELS, from its probability integral transform F(y)."""
  levels = jnp.asarray(COVERAGE_LEVELS, jnp.float32)[:, None, None]
  return jnp.abs(pit_BxT[None] - 0.5) <= 0.5 * levels
