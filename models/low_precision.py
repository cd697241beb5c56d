"""Matmuls whose forward and backward passes both run in bfloat16.

XLA:CPU picks its bfloat16 dot kernel before it lays out operands, so the
forms JAX writes by default (a transposed view, a dot contracting both batch
dimensions) are upcast to float32. These functions write the dots in the
forms that stay bfloat16; docs/performance.md has what each form costs.
"""

import functools

import jax
import jax.numpy as jnp


def transposed_copy(a_NxM: jax.Array) -> jax.Array:
  """`a.T` as a row-major copy, the form XLA:CPU multiplies in bfloat16.

  A plain `a.T` reaches XLA as a column-major view of `a`. XLA:CPU decides
  which bfloat16 dots its library kernel takes before it assigns layouts, so
  a dot whose left operand is such a view is upcast to float32 (an
  optimization barrier does not help: it inherits the view's layout). The
  same values built by splitting the rows in two, transposing in 3-D and
  merging again come out of a reshape, which XLA lays out row-major: the dot
  stays bfloat16. docs/performance.md has what both cost.

  Args:
    a_NxM: a matrix.

  Returns:
    a_MxN, equal to `a_NxM.T`.
  """
  n, m = a_NxM.shape
  if n % 2 == 0:
    a_2xHxM = a_NxM.reshape(2, n // 2, m)
    return jnp.transpose(a_2xHxM, (2, 0, 1)).reshape(m, n)
  if m % 2 == 0:  # split the columns instead
    a_Nx2xH = a_NxM.reshape(n, 2, m // 2)
    return jnp.transpose(a_Nx2xH, (1, 2, 0)).reshape(m, n)
  return a_NxM.T  # correct, but its dot runs at the float32 rate


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def low_precision_matmul(x_BxI: jax.Array, kernel_IxO: jax.Array,
                         dtype: jnp.dtype) -> jax.Array:
  """`x @ kernel` with every matmul, forward and backward, in `dtype`.

  The operands are cast to `dtype` and their products accumulate in
  float32. JAX's own derivative of such a dot feeds the float32 cotangent
  to both backward matmuls, so XLA upcasts their bfloat16 operands and runs
  them at the float32 rate. Here the cotangent is cast to `dtype` first, and
  the weight gradient `x^T @ g` multiplies a row-major copy of x^T
  (`transposed_copy`): XLA:CPU upcasts a dot that contracts the batch
  dimension of both operands, as `jax.grad` writes it.

  Args:
    x_BxI: inputs, any float dtype.
    kernel_IxO: weights, any float dtype.
    dtype: the dtype the matmuls' operands are cast to.

  Returns:
    z_BxO in float32. Gradients come back in the inputs' own dtypes,
    unrounded when those are float32.
  """
  return jax.lax.dot(x_BxI.astype(dtype), kernel_IxO.astype(dtype),
                     preferred_element_type=jnp.float32)


def _low_precision_matmul_fwd(x_BxI, kernel_IxO, dtype):
  return (low_precision_matmul(x_BxI, kernel_IxO, dtype),
          (x_BxI, kernel_IxO))


def _low_precision_matmul_bwd(dtype, residuals, g_BxO):
  x_BxI, kernel_IxO = residuals
  g_BxO = g_BxO.astype(dtype)
  # dx = g @ kernel^T: contracting the kernel's second dimension is a form
  # the bfloat16 path takes as it is.
  dx_BxI = jax.lax.dot_general(
      g_BxO, kernel_IxO.astype(dtype), (((1,), (1,)), ((), ())),
      preferred_element_type=jnp.float32)
  dkernel_IxO = jax.lax.dot(transposed_copy(x_BxI.astype(dtype)), g_BxO,
                            preferred_element_type=jnp.float32)
  return dx_BxI.astype(x_BxI.dtype), dkernel_IxO.astype(kernel_IxO.dtype)


low_precision_matmul.defvjp(_low_precision_matmul_fwd,
                            _low_precision_matmul_bwd)


def bf16_dot_general(lhs, rhs, dimension_numbers, precision=None,
                      preferred_element_type=None, out_sharding=None):
  """`nnx.Linear`'s dot_general for bfloat16 compute: low_precision_matmul."""
  if (lhs.ndim != 2 or dimension_numbers != (((1,), (0,)), ((), ()))
      or precision is not None or out_sharding is not None
      or preferred_element_type != jnp.float32):
    raise ValueError('the bfloat16 dense layer takes a 2-D x @ kernel '
                     'accumulated in float32, got dimension_numbers='
                     f'{dimension_numbers} on shapes {lhs.shape} x '
                     f'{rhs.shape}')
  return low_precision_matmul(lhs, rhs, jnp.dtype(jnp.bfloat16))
