"""Text to token ids: tokenizer.json, the back ends, their equivalence check, batching.

Layers, each importing only those before it: ``byte_level`` (what a byte-level BPE is) ->
``tokenizer`` (find, read, fingerprint, train a tokenizer.json) -> ``backend`` (the
`tokenizers` reference) -> ``equivalence`` (comparisons of a fast back end with it) ->
``tiktoken_backend``, ``fastokens_backend``, ``routing`` (fastokens' proven class of
documents sent to the reference) -> ``check_cache`` (passed checks kept between runs) -> ``spec``
(what a worker builds: `EncoderSpec`; one encoder per worker) -> ``selection`` (which back end
a run uses, and why: `decide`).
``documents`` batches a partition's documents through an encoder and cuts long ones.
"""

#: the back ends, as the command line lists them (`selection.FAST` orders the fast ones by speed)
BACKEND_NAMES: tuple[str, ...] = ("tokenizers", "tiktoken", "fastokens")
