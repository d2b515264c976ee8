r"""The LRA speed/memory table (Table 2), and any config's training step.

  python benchmark.py --out runs/bench          # every model, 1K-4K
  python benchmark.py --preset paper --models performer,local --out DIR
  python benchmark.py --models all,-transformer_fused --lengths 1024 --out DIR
  python benchmark.py --preset paper --dtype bfloat16 --models \
    transformer,transformer_fused --out DIR   # GPU: cuDNN flash attention
  python benchmark.py --config configs/listops.py:transformer,small \
    --mode throughput --out DIR   # any task's config, --config.* overrides
  python benchmark.py --config configs/listops.py:transformer,smoke \
    --mode loop --out DIR   # train.py's loop against the bare step

Each cell (model, length) times full training steps (forward, backward and
AdamW update, lra.train.steps.make_train_step) of the byte-level Text classifier
(configs/text.py, max_length = length) on random bytes, so no data set is
needed. Speed is the median of the timed steps after compilation and
warm-up. Memory is the compiled train step's from XLA's memory analysis
(temp + arguments + outputs - donated aliases, per device), which is
comparable across backends; on GPU/TPU the device's own peak is recorded too.

--config configs/<task>.py:<model>[,preset] (parsed as train.py parses it,
with any --config.<key>=<value> overrides) makes the cell that config's
training step at its own batch size and length, on random inputs of the
shapes train.py's batches have (loop.training_batch on random data: two
documents for retrieval, a label per position for mqar, an LM objective's
masked inputs). --models a,b then runs the same config file, presets and
overrides for each model; --lengths (when given) sets max_length per cell,
--batch_size and --dtype override the config's.

--models: 'all' (every key of configs.models.MODELS, the default) or a list,
measured exactly as listed. --baselines adds the exact baselines
'transformer' (einsum softmax, as LRA measured) and 'transformer_fused'
(jax.nn.dot_product_attention) in front; it is on by default only when
--models is not given ('-name' drops one). The tables' (x) ratios are to
'transformer' when it was measured; without it they are left out, and the
table says so.

--ceiling adds a row named 'ceiling', measured first in the same run: the
transformer's Text config with model.attention = {'name': 'none'} (out = v,
no token mixing; models/attention/none.py), the fastest and smallest any
attention could be at that width. The table then also gives every model's
speed and memory as a fraction of it. The ceiling is not a model name of
configs/models.py: it is never trained, and eval.py --table never shows it.

Presets (explicit --batch_size/--steps/--warmup override them):
  paper: the Text reference model (4 layers, emb 256, qkv 256, mlp 1024,
    4 heads), batch 32, 20 timed steps after 3 warm-up steps. All 32 sit
    on this machine's devices, where the paper split them over 16 TPU v3
    chips (about 2 per chip) and gave memory per device: only ratios to the
    transformer compare; --batch_size 2 is the per-chip comparison.
  cpu (the default on CPU): 2 layers, emb 64, qkv 64, mlp 128, 2 heads,
    batch 2, 5 timed steps after 1 warm-up; 1K-4K in minutes on 2 cores.
  tiny: 1 layer, emb 16, batch 2, 2 + 1 steps; for tests.
A --config cell takes its steps and warm-up from the default preset (cpu
on CPU, paper elsewhere) unless --steps/--warmup are given.

--mode:
  latency (the default): every step is waited for (block_until_ready) and
    timed on its own; steps/s is the median, with min and max.
  throughput: the timed steps are dispatched back to back and waited for
    once at the end: steps/s = steps / that time (what training sees when
    the host runs ahead of the device).
  loop (needs --config): the real training loop (train.py's
    train_and_evaluate on the config's data: two stretches of
    log_every_steps to warm up, then the timed steps; evaluation and
    checkpoints only after the last step, which its steps/s timer leaves
    out) against the bare compiled step's throughput on the same shapes in
    the same process: loop_steps_per_sec, bare_steps_per_sec and
    loop_over_bare. The loop's rate is from metrics.jsonl's train rows
    after the two warm-up stretches (loop_rate). --loop_rounds (3) pairs
    of (bare, loop) run one after the other; the row gives the medians
    (loop_over_bare: the median of the rounds' ratios) and each round in
    loop_rounds, since a shared CPU's speed drifts more between runs than
    the gap measured.

Every cell also gets examples_per_sec (steps/s x batch), tokens_per_sec
(x max_length x documents per example; CLS not counted) and mfu, model
FLOP utilisation = flops_per_step (XLA's cost analysis of the compiled step,
per device) x steps/s / the device's peak dense FLOP/s for the cell's dtype
(PEAK_FLOPS below, or --peak_flops). mfu is null where the peak is unknown
(CPU) and does not count FLOPs inside custom calls (cuDNN fused attention).

--cell_timeout_s (default 300): each cell runs in its own process (this
script with --cell_spec), killed when it runs past the deadline and
recorded with status 'timeout' (with what it wrote before: compile time,
memory, FLOPs); the run goes on with the next cell. A hang in XLA's
compiler or a device call cannot be interrupted from inside a process,
which is why a cell is a process. Each cell pays the start-up (imports and
device initialisation, seconds), and device memory is freed between cells,
so device_peak_bytes_in_use is the cell's own. --cell_timeout_s=0 runs
every cell in this process without a deadline.

--dtype bfloat16 computes every cell in bfloat16 (params stay float32). Each
row's fused_attention_kernel is 'cudnn' when the compiled step calls cuDNN's
fused attention (transformer_fused on an NVIDIA GPU in bfloat16), and the
table names those models.

Writes to --out: benchmark.json (one row per cell, rewritten after each
cell, so a killed run keeps what it measured), benchmark.md (Table 2
layout, the paper's numbers beside ours; a throughput table), speed.png and
memory.png, and cells/ (each cell process's log and row). A cell that runs
out of memory reads "OOM", one that fails "error", one past its deadline
"timeout" (its message is in the JSON and under the table); the rest go on.
"""

import os
import signal
import sys

# Ctrl-C before the entry point's own handling starts (imports, start-up):
# one line, exit 130, no traceback (run as a script; importing it sets
# nothing).
if __name__ == '__main__':
  signal.signal(
    signal.SIGINT,
    lambda *_: (print('Interrupted.', file=sys.stderr), os._exit(130)),
  )

# The measurement code is lra/lab/benchmark.py; this file is its entry point.
from lra.lab.benchmark import run

if __name__ == '__main__':
  run()
