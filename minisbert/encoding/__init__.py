"""Text to embeddings: the network and its files, with its fast room beside it.

The model shape (config), tokenizer, transformer (encoder, encoder_inputs), pooling, the network
(model: encode, save, load), checkpoint names (weights), the sentence-transformers layout
(st_directory), and which path runs it fast (backend). fast/ runs the same network on whole tiles.
"""
