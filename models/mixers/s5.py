"""S5: one multi-input multi-output diagonal SSM over all channels, scanned.

Smith, Warrington, Linderman, "Simplified State Space Layers for Sequence
Modeling" (arXiv 2208.04933).

One SSM with state size P (option state_size) reads all E channels:
  Abar = exp(Lambda dt),  Bbar = (Abar - 1) / Lambda * B~     (zero-order hold)
  x_t = Abar x_{t-1} + Bbar u_t,   y_t = 2 Re(C~ x_t) + D * u_t,  x_{-1} = 0
with Lambda, dt [P/2] (a learned step per state), B~ [P/2, E], C~ [E, P/2]
complex and D [E] real. The P/2 modes kept are the eigenvalues with positive
imaginary part; the other P/2 are their conjugates (the state of a real
system), hence the 2 Re. The recurrence is a first-order linear one, run by
jax.lax.associative_scan on the pairs (a, b) with
  (a1, b1) . (a2, b2) = (a2 a1, a2 b1 + b2).
Non-causal (mask.causal False, bidirectional True): a second scan runs the
same Abar, Bbar backwards (x'_t = Abar x'_{t+1} + Bbar u_t; stacked with the
first as one scan over the flipped sequence) and the two states are
concatenated and read by one C~ of shape [E, 2 (P/2)], i.e.
  y_t = 2 Re(C~_fwd x_t + C~_bwd x'_t) + D * u_t   (as the authors).
Then 'gelu': out = dropout(GELU(y)), GELU in its tanh form as the
authors' flax nn.gelu (option gelu_approximate=True; False: the exact erf
form) (C~ already mixes the channels, so no
output linear, as the authors' 'gelu'); 'glu': out = GLU(Linear_E->2E(
dropout(GELU(y)))), the authors' 'full_glu'.

Initialisation (HiPPO-N): HiPPO-LegS A [P, P] (A_nk = -sqrt((2n+1)(2k+1))
for n > k, -(n+1) for n = k, 0 above), its normal part A_N = A + p p^T with
p_n = sqrt(n + 1/2) (= -1/2 I + a skew-symmetric S), eigendecomposed as
A_N = V Lambda V^H (V unitary, from the Hermitian -i S); B~ = V^H B and
C~ = C V over the kept columns of V, with B real normal of variance 1/E and C
complex normal (unit variance); log dt ~ U[log dt_min, log dt_max] per
state; D standard normal. With blocks = J, Lambda and V are those of
HiPPO-N of size P/J, repeated on a block diagonal. Re Lambda is stored as
log(-Re Lambda), so it stays negative whatever is learned.

Cost: B~ u and the readout are matmuls, O(B L E P) time in `dtype` with
float32 accumulation; the scan O(B L P) work in O(log L) depth, memory
O(B L P) complex64 (the scan's elements), twice for bidirectional. The
recurrent state is P numbers (P/2 complex) per example.

Exact limit / reference: the associative scan equals the recurrence above
run step by step (tests/test_mixer_s5.py checks it against a float64 loop,
causal and bidirectional, with padding). The discretisation, the scan and
the exponentials are complex64 whatever the compute dtype.

Padding: the input is zeroed at padded positions, so padded content reaches
no output (a zero input changes the state only by the decay). For
left-packed examples ([a b c _ _]) the real outputs equal those of the
unpadded example: the forward scan reaches the padding after the last real
token, and the backward scan crosses it first, from the zero state, which
stays zero. An all-padded example gives zeros (output times the real mask).

Options (`model.attention.<option>`): state_size (P, default 64), blocks
(J, default 1; P must be a multiple of 2J), dt_min, dt_max (0.001, 0.1),
bidirectional (default True: used when the mask is not causal; a causal mask
runs the forward scan alone), activation ('gelu' | 'glu').

Deliberate differences from the authors' code (github.com/lindermanlab/S5):
  - Re Lambda is learned as log(-Re Lambda) (the authors learn it directly,
    optionally clipped), so no learned value makes the scan unstable.
  - The kept half is the eigenvalues with positive imaginary part (the
    authors keep the first half of eigh's ascending order, the conjugates):
    the same family of systems.
  - B has variance 1/E (the authors: LeCun normal over [P, E], fan-in P);
    C is complex normal (the authors' 'complex_normal' option; their
    default is a truncated standard normal per part).
  - Zero-order hold only (no bilinear option, no step_rescale); the
    authors' smaller learning rate and no weight decay for Lambda, B and dt
    are not applied (the harness's optimiser treats every parameter alike).
  - Dropout once, after GELU; the block adds its residual dropout.
"""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from models.attention.base import bool_option, int_option
from models.attention.registry import register
from models.errors import UserError
from models.mixers.base import (
  SequenceMixer,
  f32_param,
  numpy_rng,
  ssm_head_options,
  ssm_output,
  zero_padded,
)

# Local legend: N = P/2 complex modes kept, G directions (1 or 2).
_F32 = jnp.float32


def hippo_legs(size):
  """HiPPO-LegS A [size, size] (float64 numpy, negative convention)."""
  q = np.sqrt(2 * np.arange(size, dtype=np.float64) + 1)
  return -np.tril(np.outer(q, q), -1) - np.diag(np.arange(size) + 1.0)


def hippo_n(size):
  """The kept eigenpairs of HiPPO-N = A_LegS + p p^T, p_n = sqrt(n + 1/2).

  Returns (Lambda [size/2] complex, V [size, size/2] complex): the
  eigenvalues with positive imaginary part, ascending, and orthonormal
  eigenvectors (A_N V = V diag(Lambda)). float64 / complex128 numpy.
  """
  p = np.sqrt(np.arange(size, dtype=np.float64) + 0.5)
  a_n = hippo_legs(size) + np.outer(p, p)
  diag = np.diag(a_n)  # all -1/2
  s = a_n - np.diag(diag)  # skew-symmetric
  w, v = np.linalg.eigh(-1j * s)  # -i S hermitian: S v = i w v
  half = size // 2
  return diag.mean() + 1j * w[half:], v[:, half:]


def block_hippo_n(state_size, blocks):
  """(Lambda [P/2], V [P, P/2]): HiPPO-N of size P/J, J times on a block
  diagonal."""
  lam, v = hippo_n(state_size // blocks)
  r, c = v.shape
  v_full = np.zeros((state_size, state_size // 2), complex)
  for j in range(blocks):
    v_full[j * r : (j + 1) * r, j * c : (j + 1) * c] = v
  return np.tile(lam, blocks), v_full


def _combine(left, right):
  """(a1, b1) . (a2, b2) = (a2 a1, a2 b1 + b2): x_t = a_t x_{t-1} + b_t."""
  a1, b1 = left
  a2, b2 = right
  return a2 * a1, a2 * b1 + b2


def linear_scan(abar_N, bu_XxLxN, reverse=False, axis=1):
  """x_t = abar x_{t-1} + bu_t along `axis` (x_{L} = 0 when reverse),
  complex64; any leading dims X."""
  a_XxLxN = jnp.broadcast_to(abar_N, bu_XxLxN.shape)
  _, x_XxLxN = jax.lax.associative_scan(
    _combine, (a_XxLxN, bu_XxLxN), reverse=reverse, axis=axis
  )
  return x_XxLxN


@register('s5')
class S5(SequenceMixer):
  """S5 sequence mixer (see the module docstring)."""

  # The S5 authors' 'standard' opt_config (lindermanlab/S5,
  # s5/train_helpers.py): Lambda, B and the log steps at ssm_lr_base, no
  # weight decay.
  ssm_params = (
    'lambda_log_neg_re_N',
    'lambda_im_N',
    'b_re_NxE',
    'b_im_NxE',
    'log_step_N',
  )

  def __init__(
    self,
    *,
    emb_dim,
    num_heads,
    max_length,
    dropout_rate,
    dtype,
    rngs,
    layer_index=0,
    state_size=64,
    blocks=1,
    dt_min=0.001,
    dt_max=0.1,
    bidirectional=True,
    activation='gelu',
    gelu_approximate=True,
  ):
    del num_heads, max_length, layer_index
    name = 's5'
    p = int_option(name, 'state_size', state_size, 2, 64)
    j = int_option(name, 'blocks', blocks, 1, 1)
    if p % (2 * j):
      raise UserError(
        f's5 state_size must be a multiple of 2 * blocks (each block holds '
        f'conjugate pairs), got state_size={p} and blocks={j}; set e.g. '
        '--config.model.attention.state_size=64 '
        '--config.model.attention.blocks=1.'
      )
    self.dt_min, self.dt_max, self.bidirectional, self.activation = (
      ssm_head_options(name, dt_min, dt_max, bidirectional, activation)
    )
    # GELU form: the authors' flax nn.gelu (lindermanlab/S5, s5/layers.py)
    # is the tanh approximation.
    self.gelu_approximate = bool_option(
      name, 'gelu_approximate', gelu_approximate
    )
    self.p, self.blocks = p, j
    self.emb_dim = e = emb_dim
    self.dtype = dtype
    self.dropout_rate = dropout_rate
    n = p // 2
    g = 2 if self.bidirectional else 1

    rng = numpy_rng(rngs)

    lam_N, v_PxN = block_hippo_n(p, j)
    self.lambda_log_neg_re_N = f32_param(np.log(-lam_N.real))
    self.lambda_im_N = f32_param(lam_N.imag)
    b_NxE = v_PxN.conj().T @ (rng.standard_normal((p, e)) / np.sqrt(e))
    self.b_re_NxE = f32_param(b_NxE.real)
    self.b_im_NxE = f32_param(b_NxE.imag)
    c_2xGxExP = rng.standard_normal((2, g, e, p)) * np.sqrt(0.5)
    c_GxExN = (c_2xGxExP[0] + 1j * c_2xGxExP[1]) @ v_PxN
    self.c_re_GxExN = f32_param(c_GxExN.real)
    self.c_im_GxExN = f32_param(c_GxExN.imag)
    self.log_step_N = f32_param(
      rng.uniform(np.log(self.dt_min), np.log(self.dt_max), (n,))
    )
    self.d_E = f32_param(rng.standard_normal((e,)))
    self.out = (
      nnx.Linear(e, 2 * e, dtype=dtype, rngs=rngs)
      if self.activation == 'glu'
      else None
    )

  def state_size(self):
    """P: the causal recurrence's state (P/2 complex numbers)."""
    return self.p

  def state_matrix(self):
    """The diagonal Lambda, complex64 [N]."""
    return -jnp.exp(self.lambda_log_neg_re_N[...]) + 1j * self.lambda_im_N[...]

  def discretized(self):
    """(Abar, Bbar / B~) as complex64 [N], [N]: Bbar = coef[:, None] B~."""
    lam_N = self.state_matrix()
    abar_N = jnp.exp(lam_N * jnp.exp(self.log_step_N[...]))
    return abar_N, (abar_N - 1.0) / lam_N

  def _matmul(self, a, b, spec):
    return jnp.einsum(
      spec,
      a.astype(self.dtype),
      b.astype(self.dtype),
      preferred_element_type=_F32,
    )

  def ssm(self, u_BxLxE, causal):
    """The SSM alone, float32: y = 2 Re(C~ x) + D u (both directions)."""
    abar_N, coef_N = self.discretized()
    spec = 'ble,ne->bln'
    bu_BxLxN = coef_N * (
      self._matmul(u_BxLxE, self.b_re_NxE[...], spec)
      + 1j * self._matmul(u_BxLxE, self.b_im_NxE[...], spec)
    )
    y_BxLxE = self.d_E[...] * u_BxLxE.astype(_F32)
    if self.bidirectional and not causal:
      # One scan for both directions: the backward one on the flipped
      # sequence, flipped back (= the reverse scan).
      both_2xBxLxN = jnp.stack([bu_BxLxN, bu_BxLxN[:, ::-1]])
      x_2xBxLxN = linear_scan(abar_N, both_2xBxLxN, axis=2)
      states = (x_2xBxLxN[0], x_2xBxLxN[1][:, ::-1])
    else:
      states = (linear_scan(abar_N, bu_BxLxN),)
    spec = 'bln,en->ble'
    for g, x_BxLxN in enumerate(states):
      y_BxLxE = y_BxLxE + 2.0 * (
        self._matmul(x_BxLxN.real, self.c_re_GxExN[...][g], spec)
        - self._matmul(x_BxLxN.imag, self.c_im_GxExN[...][g], spec)
      )
    return y_BxLxE

  def __call__(self, x_BxLxE, mask, *, rngs=None):
    u_BxLxE = zero_padded(x_BxLxE, mask).astype(_F32)
    y_BxLxE = self.ssm(u_BxLxE, mask.causal)
    return ssm_output(self, y_BxLxE, x_BxLxE, mask, rngs)
