r"""Our attention against the PyTorch module a user would pick, on the CPU.

  pip install torch local-attention linformer performer-pytorch   # the peers
  python -m experiments.race.race --lengths 1024,4096 --rounds 5 --out runs/race

Each pair runs the same computation on the same float32 inputs, forward +
backward (the gradient of the sum of the output with respect to the inputs
and the parameters), and is checked equal first (outputs and gradients
within a relative 1e-3 of their largest value); then `rounds` rounds time
ours and the peer one after the other, in this one process, so a shared
machine's drift touches both alike. A row gives each side's median ms,
the median over rounds of peer ms / our ms (> 1: ours faster) and XLA's
compiled temporary memory of our forward + backward.

Pairs (B = --batch, H = --heads, D = --head_dim, L the length):
  transformer        our exact core, einsum path, on q, k, v [B, L, H, D]
                     against torch.nn.functional.scaled_dot_product_attention
                     (its CPU flash kernel) on the same q, k, v; no mask
  transformer_fused  our exact core, fused path (jax.nn.dot_product_attention)
                     against the same
  local              our block-local core (blocks of 50, the model's default)
                     against local_attention.LocalAttention(window_size=50,
                     look_backward=0, look_forward=0, autopad=True), both
                     given an all-True key padding mask (the peer masks its
                     padded tail only through one)
  linformer          a self-attention layer on x [B, L, H x D]: our model's
                     attention layer (models/layers.py MultiHeadAttention,
                     the Linformer core with k = 256, E, F shared over heads;
                     it projects x along length first, (E^T x) W_k, equal to
                     the peer's E^T (x W_k)) plus the peer's output bias,
                     against linformer.LinformerSelfAttention, its weights
                     copied into ours
  performer          our FAVOR+ core (256 positive orthogonal features, the
                     model's default) against performer_pytorch.FastAttention
                     (nb_features=256) on the same q, k, v, its projection
                     matrix copied into ours for every head; the peer's
                     kernel is called with eps = 0 (by default it adds 1e-4
                     to every feature, where ours adds nothing; the work is
                     the same)
Each side uses the threads its library starts with (all cores).

Writes race.json and race.md to --out when given; prints the table.
"""

import argparse
import json
import os
import statistics
import time

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from lra.bench.layer import layer_options
from lra.errors import UserError
from models.attention import registry
from models.attention.base import Mask
from models.layers import MultiHeadAttention

PAIRS = ('transformer', 'transformer_fused', 'local', 'linformer', 'performer')
PEERS = {
  'transformer': 'torch.nn.functional.scaled_dot_product_attention',
  'transformer_fused': 'torch.nn.functional.scaled_dot_product_attention',
  'local': 'local_attention.LocalAttention',
  'linformer': 'linformer.LinformerSelfAttention',
  'performer': 'performer_pytorch.FastAttention',
}
INSTALL = 'pip install torch local-attention linformer performer-pytorch'
TOLERANCE = 1e-3


def _torch():
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UserError(
      f'the race needs PyTorch and the peers: {INSTALL}'
    ) from None
  return torch


def _peer_module(pair):
  try:
    if pair == 'local':
      import local_attention  # pylint: disable=g-import-not-at-top

      return local_attention
    if pair == 'linformer':
      import linformer  # pylint: disable=g-import-not-at-top

      return linformer
    if pair == 'performer':
      from performer_pytorch import performer_pytorch  # pylint: disable=g-import-not-at-top

      return performer_pytorch
  except ImportError:
    raise UserError(f'the {pair} peer is not installed: {INSTALL}') from None
  return None


def _timed(fn):
  start = time.perf_counter()
  fn()
  return (time.perf_counter() - start) * 1e3


def _core(model, head_dim, heads, length):
  options = layer_options(model)
  return options, registry.build(
    options,
    head_dim=head_dim,
    num_heads=heads,
    max_length=length,
    dropout_rate=0.0,
    dtype=jnp.float32,
    rngs=nnx.Rngs(0),
  )


class Pair:
  """Both sides of one pair at one length, compiled and checked equal.

  ours() and peer() run one forward + backward each, waited for."""

  def __init__(self, pair, b, length, h, d, seed=0):
    torch = _torch()
    self.name, self.length = pair, length
    rng = np.random.default_rng(seed)
    model = 'transformer' if pair == 'transformer' else pair
    if pair == 'linformer':
      x = rng.standard_normal((b, length, h * d), np.float32)
      self._linformer(torch, x, h, d, length)
    else:
      qkv = [rng.standard_normal((b, length, h, d), np.float32) for _ in '123']
      options, core = _core(model, d, h, length)
      if pair == 'performer':
        self._performer_peer(torch, core, d, h)
      padding = np.ones((b, length), bool) if pair == 'local' else None
      self._ours_core(core, qkv, padding)
      self._peer_core(torch, pair, options, qkv, padding, h)
    self.check()

  # ----------------------------------------------------------- our side
  def _ours_core(self, core, qkv, padding):
    graphdef, params, rest = nnx.split(core, nnx.Param, ...)

    def forward(params, inputs):
      module = nnx.merge(graphdef, params, rest)
      pad = None if padding is None else jnp.asarray(padding)
      out, _ = module(*inputs, Mask(pad, False))
      return out

    self._ours_args = (params, tuple(jnp.asarray(a) for a in qkv))
    self._compile(forward)

  def _compile(self, forward):
    def loss(*args):
      return jnp.sum(forward(*args))

    self._fwd = jax.jit(forward).lower(*self._ours_args).compile()
    self._grad = (
      jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*self._ours_args).compile()
    )
    self.ours_temp_bytes = int(self._grad.memory_analysis().temp_size_in_bytes)

  def ours(self):
    jax.block_until_ready(self._grad(*self._ours_args))

  def ours_values(self):
    """(output, gradients of the inputs) as numpy, in the peer's layout."""
    out = np.asarray(self._fwd(*self._ours_args))
    grads = jax.tree.map(np.asarray, self._grad(*self._ours_args)[1])
    return out, list(grads)

  # ---------------------------------------------------------- peer side
  def _peer_core(self, torch, pair, options, qkv, padding, h):
    # The peer's layout is [B, H, L, D]; the transposes are done here,
    # outside the timed calls.
    self._peer_inputs = [
      torch.tensor(a.transpose(0, 2, 1, 3).copy(), requires_grad=True)
      for a in qkv
    ]
    if pair == 'performer':
      self._peer_fn = self._performer
    elif pair == 'local':
      local = _peer_module('local').LocalAttention(
        window_size=options['block_size'],
        causal=False,
        look_backward=0,
        look_forward=0,
        autopad=True,
      )
      mask = torch.tensor(padding)
      self._peer_fn = lambda q, k, v: local(q, k, v, input_mask=mask)
    else:
      sdpa = torch.nn.functional.scaled_dot_product_attention
      self._peer_fn = sdpa
    self._to_ours_layout = lambda t: t.detach().numpy().transpose(0, 2, 1, 3)

  def peer(self):
    for t in self._peer_inputs:
      t.grad = None
    out = self._peer_fn(*self._peer_inputs)
    out.sum().backward()

  def peer_values(self):
    for t in self._peer_inputs:
      t.grad = None
    out = self._peer_fn(*self._peer_inputs)
    out.sum().backward()
    return self._to_ours_layout(out), [
      self._to_ours_layout(t.grad) for t in self._peer_inputs
    ]

  # --------------------------------------------------------- performer
  def _performer_peer(self, torch, core, d, h):
    module = _peer_module('performer')
    torch.manual_seed(0)
    peer = module.FastAttention(dim_heads=d, nb_features=core.num_features)
    w_FxD = peer.projection_matrix.detach().numpy()
    core.features[...] = jnp.asarray(np.broadcast_to(w_FxD, (h, *w_FxD.shape)))
    self._performer_module, self._performer_attention = module, peer

  def _performer(self, q, k, v):
    # FastAttention.forward with the kernel's eps set to 0: the same
    # functions of the peer's module, in the same order.
    module, peer = self._performer_module, self._performer_attention
    kernel = module.softmax_kernel
    w = peer.projection_matrix
    q = kernel(q, projection_matrix=w, is_query=True, eps=0.0)
    k = kernel(k, projection_matrix=w, is_query=False, eps=0.0)
    return module.linear_attention(q, k, v)

  # --------------------------------------------------------- linformer
  def _linformer(self, torch, x, h, d, length):
    torch.manual_seed(0)
    peer = _peer_module('linformer').LinformerSelfAttention(
      dim=h * d, seq_len=length, k=256, heads=h, dim_head=d
    )
    options = layer_options('linformer')
    if options['proj_length'] != 256 or not options['share_heads']:
      raise UserError('the linformer pair expects k = 256 shared over heads.')
    # Our model's attention layer itself, the peer's weights in it: E, F
    # [L, k]; nnx.Linear kernels [in, out] are torch's weights transposed.
    layer = MultiHeadAttention(
      h * d,
      h * d,
      h,
      options,
      max_length=length,
      dropout_rate=0.0,
      dtype=jnp.float32,
      rngs=nnx.Rngs(0),
    )
    layer.core.e_MxK[...] = jnp.asarray(peer.proj_k.detach().numpy())
    layer.core.f_MxK[...] = jnp.asarray(peer.proj_v.detach().numpy())
    for ours, theirs in (
      (layer.query, peer.to_q),
      (layer.key, peer.to_k),
      (layer.value, peer.to_v),
      (layer.out, peer.to_out),
    ):
      ours.kernel[...] = jnp.asarray(theirs.weight.detach().numpy().T)
    # The peer's output projection has a bias; our layer's has none.
    bias = jnp.asarray(peer.to_out.bias.detach().numpy())
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

    def forward(params, inputs):
      (x_BxLxE,) = inputs
      out, _ = nnx.merge(graphdef, params['layer'], rest)(
        x_BxLxE, Mask(None, False)
      )
      return out + params['bias']

    self._ours_args = ({'layer': params, 'bias': bias}, (jnp.asarray(x),))
    self._compile(forward)
    self._peer_inputs = [torch.tensor(x, requires_grad=True)]
    self._peer_fn = peer
    self._to_ours_layout = lambda t: t.detach().numpy()

  # ------------------------------------------------------------- check
  def check(self):
    """Outputs and input gradients equal within TOLERANCE (relative to the
    largest magnitude); raises AssertionError naming the difference."""
    ours, peer = self.ours_values(), self.peer_values()
    worst = 0.0
    for a, b in zip([ours[0], *ours[1]], [peer[0], *peer[1]]):
      assert a.shape == b.shape, (a.shape, b.shape)
      scale = max(float(np.abs(b).max()), 1e-6)
      worst = max(worst, float(np.abs(a - b).max()) / scale)
    self.max_relative_difference = worst
    assert worst < TOLERANCE, f'{self.name}: outputs differ by {worst:.2e}'


def run_length(pairs, length, args, log):
  """Every pair at one length: built, checked, warmed up, then `rounds`
  alternating rounds (ours, peer, ours, peer, ...)."""
  rows, built = [], []
  for name in pairs:
    row = {'pair': name, 'peer': PEERS[name], 'length': length}
    try:
      pair = Pair(name, args.batch, length, args.heads, args.head_dim)
      row['max_relative_difference'] = pair.max_relative_difference
      # XLA's compiled working memory of our forward + backward.
      row['ours_temp_mb'] = pair.ours_temp_bytes / 1e6
      for _ in range(args.warmup):
        pair.ours()
        pair.peer()
      built.append((row, pair))
    except (AssertionError, MemoryError, RuntimeError, UserError) as e:
      row['error'] = f'{type(e).__name__}: {e}'.splitlines()[0]
    rows.append(row)
  load = []
  for r in range(args.rounds):
    load.append(os.getloadavg()[0])
    for row, pair in built:
      row.setdefault('ours_ms_rounds', []).append(_timed(pair.ours))
      row.setdefault('peer_ms_rounds', []).append(_timed(pair.peer))
    log(f'L={length} round {r + 1}/{args.rounds}')
  for row, _ in built:
    ours, peer = row['ours_ms_rounds'], row['peer_ms_rounds']
    row.update(
      ours_ms=statistics.median(ours),
      peer_ms=statistics.median(peer),
      peer_over_ours=statistics.median(p / o for p, o in zip(peer, ours)),
      load_1min=[min(load), statistics.median(load), max(load)],
    )
  return rows


def markdown(rows):
  out = [
    '| pair | peer | L | ours ms | peer ms | peer / ours | max rel. diff '
    '| ours temp MB |',
    '|---|---|---|---|---|---|---|---|',
  ]
  for r in rows:
    if 'error' in r:
      out.append(
        f'| {r["pair"]} | {r["peer"]} | {r["length"]} | | | {r["error"]} | | |'
      )
      continue
    out.append(
      f'| {r["pair"]} | {r["peer"]} | {r["length"]} | {r["ours_ms"]:.1f} | '
      f'{r["peer_ms"]:.1f} | {r["peer_over_ours"]:.2f} | '
      f'{r["max_relative_difference"]:.0e} | {r["ours_temp_mb"]:,.0f} |'
    )
  return '\n'.join(out) + '\n'


def parse_args(argv=None):
  p = argparse.ArgumentParser(
    prog='python -m experiments.race.race',
    description='Our attention against the PyTorch module a user would pick.',
  )
  p.add_argument('--pairs', default=','.join(PAIRS))
  p.add_argument('--lengths', default='1024,4096')
  p.add_argument('--batch', type=int, default=2)
  p.add_argument('--heads', type=int, default=4)
  p.add_argument('--head_dim', type=int, default=64)
  p.add_argument('--rounds', type=int, default=5)
  p.add_argument('--warmup', type=int, default=1)
  p.add_argument('--out', default=None)
  args = p.parse_args(argv)
  args.pairs = [x for x in args.pairs.split(',') if x]
  unknown = [x for x in args.pairs if x not in PAIRS]
  if unknown:
    p.error(f'unknown pair {unknown[0]!r}; give some of {",".join(PAIRS)}')
  try:
    args.lengths = [int(x) for x in args.lengths.split(',') if x]
  except ValueError:
    p.error('--lengths is a comma-separated list of integers')
  return args


def main(argv=None):
  args = parse_args(argv)
  _torch()
  rows = []
  for length in args.lengths:
    rows += run_length(args.pairs, length, args, lambda s: print(s, flush=True))
    if args.out:
      os.makedirs(args.out, exist_ok=True)
      with open(os.path.join(args.out, 'race.json'), 'w') as f:
        json.dump(rows, f, indent=1)
  text = markdown(rows)
  if args.out:
    with open(os.path.join(args.out, 'race.md'), 'w') as f:
      f.write(text)
  print(text, end='')


if __name__ == '__main__':
  try:
    main()
  except UserError as e:
    raise SystemExit(f'error: {e}') from None
