"""The KV cache: per-layer caches, codecs, specs and byte accounting.

Modules:

- ``cache``: the per-layer protocol (``attend``, ``offset``, ``window``, ``can_trim``/
  ``trim``, ``nbytes``/``bytes_at``, ``state``/``load_state``) and the dense f32/f16/bf16 cache.
- ``recurrent``: a hybrid model's linear-attention layer in the same protocol: its exact
  float32 state (convolution inputs, delta-rule state) and checkpoints at prefill chunk ends.
- ``fused``: what the caches hand to the fused attention kernel (``kernels/attention``).
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

Every measured figure (ΔPPL and KLD per type and text, needle pass rates, speed)
is in docs/benchmarks.md, with the committed command that produced it.
"""
