"""sentence-transformers' calls over the network, for code ported from it.

Its SentenceTransformer class (sentence_transformer), prompts, precision= (quantize), util, and what
minisbert refuses by name (refused).
"""
