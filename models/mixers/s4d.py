"""S4D: a diagonal state space model per channel, run as an FFT convolution.

Gu, Gupta, Goel, Re, "On the Parameterization and Initialization of Diagonal
State Space Models" (arXiv 2206.11893).

Each of the E channels is its own single-input single-output SSM with a
diagonal complex state matrix A (state_size = N real dimensions kept as
N/2 complex modes; the other N/2 are their conjugates, hence the 2 Re):
  dA = exp(dt A),  dB = (dA - 1) / A * B          (zero-order hold)
  x_t = dA x_{t-1} + dB u_t,   y_t = 2 Re(C x_t) + D u_t,   x_{-1} = 0
which is the causal convolution y = K * u + D u with the kernel
  K_l = 2 Re(sum_n C_n dB_n dA_n^l),  l = 0 .. L-1   (a Vandermonde product).
Non-causal (mask.causal False, bidirectional True): a second kernel K' (its
own C, the same A, B, dt) is run over the reversed sequence,
  y = K * u + reverse(K' * reverse(u)) + D u,
i.e. y_t = sum_{s<=t} K_{t-s} u_s + sum_{s>=t} K'_{s-t} u_s + D u_t.
Both convolutions are one FFT product of length 2L (no wrap-around). Then
  'gelu': out = Linear_E->E(dropout(GELU(y)))
  'glu':  out = GLU(Linear_E->2E(dropout(GELU(y))))   (a * sigmoid(b))
as the authors' S4D layer.

Initialisation: S4D-Lin A_n = -1/2 + i pi n (init='lin', default) or S4D-Inv
A_n = -1/2 + i (N/pi) (N/(2n+1) - 1) (init='inv'), n = 0 .. N/2-1; B = 1;
C complex standard normal (real and imaginary parts of variance 1/2);
log dt ~ U[log dt_min, log dt_max] per channel; D standard normal.
Re A is stored as log(-Re A), so it stays negative whatever is learned.

Cost: the kernels take O(G E N L) time and O(G E (N sqrt(L) + L)) memory
(the Vandermonde product is a matmul of dA^(iT) [N, L/T] by dA^j [N, T],
T = ceil(sqrt(L)), never the [E, N, L] array); the convolution O(B E L log
L) time and O(B E L) memory; G = 1 causal, 2 bidirectional. The recurrent
state is E N numbers (E N/2 complex) per example.

Exact limit / reference: the FFT convolution equals the recurrence above run
step by step (tests/test_mixer_s4d.py checks it against a float64 loop,
causal and bidirectional, with padding). Kernels, FFTs and exponentials are
float32 / complex64 whatever the compute dtype; only the output linear runs
in `dtype`. Float32 limit: the phase dt Im(A) l of the longest lags is
rounded to about 6e-8 of its size (as in the authors' complex64 kernel).

Padding: the input is zeroed at padded positions, so padded content reaches
no output, and (padding being zeros) a forward step over it changes the
state only by the decay. For left-packed examples ([a b c _ _]) the real
outputs equal those of the unpadded example: the forward kernel never looks
ahead, and the reversed pass sees the zeros first, from the zero state. An
all-padded example gives zeros (the output is multiplied by the real mask).

Options (`model.attention.<option>`): state_size (N, even, default 64),
init ('lin' | 'inv'), dt_min, dt_max (0.001, 0.1), bidirectional (default
True: used when the mask is not causal; a causal mask always runs the
forward kernel alone), activation ('gelu' | 'glu').

Deliberate differences from the authors' code (github.com/state-spaces/s4):
  - Bidirectional: both kernels include lag 0, as the equation above; the
    authors' FFTConv shifts the backward kernel by one (K'_j at lag -(j+1),
    a deliberate off-by-one in their comment), so there the present token is
    read by the forward kernel only.
  - The authors train A, B and dt with a smaller learning rate (0.001) and
    no weight decay; here they are ordinary parameters of the harness's
    optimiser.
  - Dropout is plain inverted dropout after the activation (the authors tie
    it over the length axis by default); the block adds its residual
    dropout afterwards.
  - 'gelu' has an E -> E output linear (the authors' S4D block always ends
    in the GLU form, 'glu' here).
"""

import math

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from models.attention.base import bool_option, int_option
from models.attention.registry import register
from models.errors import UserError
from models.mixers.base import (
  SequenceMixer,
  choice_option,
  f32_param,
  numpy_rng,
  ssm_head_options,
  ssm_output,
  zero_padded,
)

# Local legend: N complex modes (state_size / 2), G directions (1 or 2),
# T the Vandermonde chunk, I the number of chunks.
_F32 = jnp.float32
_HIGHEST = jax.lax.Precision.HIGHEST


def s4d_init_imag(state_size, init):
  """Im(A_n), n = 0 .. N/2-1, for S4D-Lin or S4D-Inv (float64 numpy)."""
  n = np.arange(state_size // 2, dtype=np.float64)
  if init == 'lin':
    return np.pi * n
  return state_size / np.pi * (state_size / (2 * n + 1) - 1)


def vandermonde_kernel(coef_GxExN, dta_ExN, length):
  """K[g, e, l] = 2 Re(sum_n coef[g, e, n] exp(dta[e, n] l)), l < length.

  Chunked: l = i T + j, so exp(dta l) = exp(dta i T) exp(dta j) and the sum
  over n is a matmul of [I, N] by [N, T] per (g, e); memory O(E N sqrt(L)).
  """
  t = math.isqrt(max(length - 1, 0)) + 1  # ceil(sqrt(L))
  chunks = -(-length // t)
  outer_ExNxI = jnp.exp(dta_ExN[..., None] * (t * jnp.arange(chunks)))
  inner_ExNxT = jnp.exp(dta_ExN[..., None] * jnp.arange(t))
  coef_GxExNxI = coef_GxExN[..., None] * outer_ExNxI[None]
  k_GxExIxT = jnp.einsum(
    'geni,enj->geij', coef_GxExNxI, inner_ExNxT, precision=_HIGHEST
  )
  g, e = coef_GxExN.shape[:2]
  return 2.0 * jnp.real(k_GxExIxT).reshape(g, e, chunks * t)[..., :length]


def fft_conv(u_BxLxE, k_fwd_ExL, k_bwd_ExL=None):
  """sum_{s<=t} k_fwd[t-s] u_s (+ sum_{s>=t} k_bwd[s-t] u_s), float32.

  One real FFT of length 2L: the backward kernel sits at the negative lags
  2L - j, so nothing wraps around.
  """
  length = u_BxLxE.shape[1]
  n = 2 * length
  k_Ex2L = jnp.pad(k_fwd_ExL, ((0, 0), (0, length)))
  if k_bwd_ExL is not None:
    k_Ex2L = k_Ex2L.at[:, 0].add(k_bwd_ExL[:, 0])
    k_Ex2L = k_Ex2L.at[:, length + 1 :].set(k_bwd_ExL[:, :0:-1])
  uf = jnp.fft.rfft(u_BxLxE.astype(_F32), n=n, axis=1)
  kf = jnp.fft.rfft(k_Ex2L, n=n, axis=-1).T
  return jnp.fft.irfft(uf * kf[None], n=n, axis=1)[:, :length].astype(_F32)


@register('s4d')
class S4D(SequenceMixer):
  """S4D sequence mixer (see the module docstring)."""

  # The S4 authors' (state-spaces/s4, models/s4/s4.py `register`): A, B
  # and dt at their own rate, no weight decay.
  ssm_params = (
    'a_log_neg_re_ExN',
    'a_im_ExN',
    'b_re_ExN',
    'b_im_ExN',
    'log_dt_E',
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
    init='lin',
    dt_min=0.001,
    dt_max=0.1,
    bidirectional=True,
    activation='gelu',
    gelu_approximate=False,
  ):
    del num_heads, max_length, layer_index
    name = 's4d'
    n_full = int_option(name, 'state_size', state_size, 2, 64)
    if n_full % 2:
      raise UserError(
        f's4d state_size must be even (N/2 complex conjugate pairs), got '
        f'{n_full}; set e.g. --config.model.attention.state_size=64.'
      )
    self.init = choice_option(name, 'init', init, ('lin', 'inv'))
    self.dt_min, self.dt_max, self.bidirectional, self.activation = (
      ssm_head_options(name, dt_min, dt_max, bidirectional, activation)
    )
    # GELU form: the authors' PyTorch nn.GELU() (state-spaces/s4,
    # models/s4/s4d.py) is the exact erf form.
    self.gelu_approximate = bool_option(
      name, 'gelu_approximate', gelu_approximate
    )
    self.n_full = n_full
    self.emb_dim = e = emb_dim
    self.dtype = dtype
    self.dropout_rate = dropout_rate
    n = n_full // 2
    g = 2 if self.bidirectional else 1
    rng = numpy_rng(rngs)

    self.a_log_neg_re_ExN = f32_param(np.full((e, n), np.log(0.5)))
    imag_N = s4d_init_imag(n_full, self.init)
    self.a_im_ExN = f32_param(np.broadcast_to(imag_N, (e, n)))
    self.b_re_ExN = f32_param(np.ones((e, n)))
    self.b_im_ExN = f32_param(np.zeros((e, n)))
    self.c_re_GxExN = f32_param(np.sqrt(0.5) * rng.standard_normal((g, e, n)))
    self.c_im_GxExN = f32_param(np.sqrt(0.5) * rng.standard_normal((g, e, n)))
    self.log_dt_E = f32_param(
      rng.uniform(np.log(self.dt_min), np.log(self.dt_max), (e,))
    )
    self.d_E = f32_param(rng.standard_normal((e,)))
    out_dim = 2 * e if self.activation == 'glu' else e
    self.out = nnx.Linear(e, out_dim, dtype=dtype, rngs=rngs)

  def state_size(self):
    """E N: the causal recurrence's state (E N/2 complex numbers)."""
    return self.emb_dim * self.n_full

  def state_matrix(self):
    """The diagonal A, complex64 [E, N]."""
    return -jnp.exp(self.a_log_neg_re_ExN[...]) + 1j * self.a_im_ExN[...]

  def discretized(self):
    """(dt A, dB, C) as complex64 [E, N], [E, N], [G, E, N]."""
    a = self.state_matrix()
    dt_E = jnp.exp(self.log_dt_E[...])
    dta_ExN = dt_E[:, None] * a
    b = self.b_re_ExN[...] + 1j * self.b_im_ExN[...]
    db_ExN = (jnp.exp(dta_ExN) - 1.0) / a * b
    c_GxExN = self.c_re_GxExN[...] + 1j * self.c_im_GxExN[...]
    return dta_ExN, db_ExN, c_GxExN

  def kernels(self, length):
    """float32 [G, E, L]: the forward kernel (and the backward one)."""
    dta_ExN, db_ExN, c_GxExN = self.discretized()
    return vandermonde_kernel(c_GxExN * db_ExN[None], dta_ExN, length)

  def ssm(self, u_BxLxE, causal):
    """The SSM alone, float32: y = K * u (+ reversed K' pass) + D u."""
    length = u_BxLxE.shape[1]
    k_GxExL = self.kernels(length)
    two_way = self.bidirectional and not causal
    y = fft_conv(u_BxLxE, k_GxExL[0], k_GxExL[1] if two_way else None)
    return y + self.d_E[...] * u_BxLxE.astype(_F32)

  def __call__(self, x_BxLxE, mask, *, rngs=None):
    u_BxLxE = zero_padded(x_BxLxE, mask).astype(_F32)
    y_BxLxE = self.ssm(u_BxLxE, mask.causal)
    return ssm_output(self, y_BxLxE, x_BxLxE, mask, rngs)
