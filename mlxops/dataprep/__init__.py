"""``mlxops data prepare``: a corpus tokenized into token shards and their manifest, on the
controller (the format: :mod:`mlxops.trainer.shardformat`; for people: docs/cli.md and
docs/formats.md).

* :mod:`.inputs`: the documents of text, JSONL, Parquet and ``datasets.save_to_disk``
  inputs, streamed in batches of bounded size;
* :mod:`.encoders`: the tokenizers (byte-level, a ``tokenizer.json``, a tiktoken encoding
  from a local file, or a BPE trained on the inputs) behind one interface;
* :mod:`.optional`: the optional dependencies (the ``data`` extra), one error naming it;
* :mod:`.writer`: a split's shards, written as tokens come, kept when equal;
* :mod:`.prepare`: the run: hashes, split, shards, manifest, nothing rewritten that is equal.
"""
