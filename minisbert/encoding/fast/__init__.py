"""The encoder's speed, beside the plain network: the same bits in any batch, on whole tiles.

Products on whole tiles (tiled_linear), the encoder that uses them (tiled_encoder), and encode()'s
batches (batching: FAST_PATH). The plain network never imports this folder; minisbert.load plugs it in.
"""
