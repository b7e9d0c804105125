"""The KV cache: per-layer caches, codecs, specs and byte accounting.

Modules:

- ``cache``: the per-layer protocol (``attend``, ``offset``, ``window``, ``trim``,
  ``nbytes``, ``state``/``load_state``) and the dense f32/f16/bf16 cache.
- ``codecs``: q8_0 and q4_0 (llama.cpp blocks), TurboQuant-MSE ``tq2/3/4``,
  TurboQuant-prod ``tqp``/``tqp3``, KVarN ``kvarn2/3/4``, KIVI ``kivi2/3/4``; each
  also as published under ``-paper``.
- ``compressed``: the compressed layer cache (exact sink + compressed body + exact
  recent pool) and its attention straight from the codes.
- ``spec``: ``parse_kv`` for ``--kv``/``kv=`` (type, ``K:V``, presets, sink/window and
  per-layer options), ``KVSpec.make_caches``, and ``kv_bytes_per_token``.
- ``bits``, ``rotation``: bit packing with table decoding; seeded Hadamard rotations.

Our variants (plain names) versus the papers (``-paper``). All are exact for
attention, so they change only what the codec has to represent:

1. An exact sink (first 4 tokens; 16 for TurboQuant) and recent window (last 128
   tokens; 256 for types of 3 bits and less; tokens leave it 32 at a time), kept in
   fp16; a prefill attends to what is stored.
2. A fixed per-channel centre c and scale w, fitted on the first block the layer
   compresses; the codec encodes (x - c) / w. Keys: score = (q * w) . code + q . c,
   with w = sqrt(std(k) / rms(q)), which minimizes the score error of a
   per-vector codec. Values: out = w * (sum p code) + c * (sum p), w = sqrt(std(v)).
3. q8_0/q4_0 rotate (the Hadamard of llama.cpp PR #21038); tqB stores the
   least-squares scale instead of the norm; kiviB flushes keys every 32 tokens.

The full protocol (6 chunks, with the sink and window turned off beside each type)
is in docs/benchmarks.md, from ``python bench/make_benchmarks.py --only ppl``; the
one-chunk exploration below chose the variants (sink 4, per-token flush).

Measured on the embedded Gemma 3 270M, essays corpus, context 2048, chunk 1 only
(1,023 scored tokens, the second half; f16 PPL 18.398), with ``tightkv.eval.ppl``.
One chunk is noisy for PPL (+-0.3% is within noise); KLD is the steadier figure.

==================================  ===========  =========  ========================
type                                ΔPPL vs f16  mean KLD   x smaller than FP32 (32K)
==================================  ===========  =========  ========================
q8_0                                +0.00%       0.00002    3.7
k8v4 (q8_0 keys, tq4 values)        +0.12%       0.0013     4.9
q4_0 (ours)                         +0.00%       0.0025     6.7
tq4 / progressive                   +0.48%       0.0040     7.4
tq4, centre only (no scales)        +0.71%       0.0076     7.4
kvarn4                              +0.21%       0.0013     6.6
kivi4                               +0.63%       0.0019     6.0
tq3 (window 256)                    +0.59%       0.0108     8.8
tq3 with window 128                 +3.05%       0.0192     9.6
aggressive (kvarn3:tq3, window 256) +0.46%       0.0046     7.8
tq4:tq3, window 128                 +1.91%       0.0083     8.3
tq4-paper (nothing exact)           +17.6%       0.161      7.9
q4_0-paper (nothing exact)          +14.0%       0.124      7.1
==================================  ===========  =========  ========================

llama.cpp's q4_0 on the full protocol: +9.2% (REFERENCES.md). The last column
counts every layer as stored (Gemma 3 keeps 512 tokens in 15 of 18 layers), all
metadata and exact tokens included, against FP32 under the same window policy.

A cheaper proxy chose the variants: each layer's attention output error against
exact attention on captured q, k, v of the same chunk (relative squared error,
mean of 18 layers; about half the mean KLD): tq4-paper 6.8e-2; plus sink and
window 7.0e-3; plus centring 4.1e-3; plus scales 2.0e-3. q4_0-paper 4.7e-2, q4_0
1.4e-3. kvarn4 1.8e-3 without scales, 0.9e-3 with. kivi4 1.9e-3, 1.2e-3.
Sink size (1, 4, 16) hardly matters; a 256-token window halves the 3-bit error.
"""
