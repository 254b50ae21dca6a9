"""Tests of minisbert/encoding/: the network: tokenizer, encoder, pooling, the model's files, the fast encoder's bits."""
