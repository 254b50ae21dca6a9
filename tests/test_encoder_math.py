"""The encoder's pieces on their own: gradients, and fused kernels against the written-out math.

gradcheck compares autograd's gradient with finite differences in float64; if a hand-written
function had a mistake that autograd faithfully differentiated, the parity tests catch it instead
(tests/test_encoder.py). Here we learn that each piece is smooth and differentiable as written.
"""

import torch
import torch.nn.functional as F
from torch.autograd import gradcheck

from minisbert.config import EncoderConfig
from minisbert import encoder as encoder_module
from minisbert.encoder import (Encoder, SelfAttention, additive_attention_mask, gelu, gelu_tanh,
                               layer_norm, reusing_memory)
from minisbert.pooling import max_pool, mean_pool, normalize

TINY = dict(family="bert", vocab_size=50, hidden_size=16, num_layers=2, num_heads=4, intermediate_size=32,
            max_position_embeddings=20, type_vocab_size=2, layer_norm_eps=1e-12, activation="gelu",
            pad_token_id=0, hidden_dropout=0.0, attention_dropout=0.0)


def double(shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True)


def test_layer_norm_gradcheck():
    x, w, b = double((3, 5, 8)), double((8,), 1), double((8,), 2)
    assert gradcheck(lambda x, w, b: layer_norm(x, w, b, 1e-5), (x, w, b))


def test_layer_norm_equals_torch_and_uses_biased_variance():
    x, w, b = double((3, 5, 8)), double((8,), 1), double((8,), 2)
    expected = F.layer_norm(x, (8,), w, b, 1e-12)
    assert torch.allclose(layer_norm(x, w, b, 1e-12), expected, atol=1e-12)
    # With var computed as /(H-1) the result would differ by a factor sqrt(8/7):
    row = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    # mean 2, biased variance ((1-2)^2 + (3-2)^2)/2 = 1, so the output is (-1, 1)
    assert torch.allclose(layer_norm(row, torch.ones(2), torch.zeros(2), 0.0), torch.tensor([[-1.0, 1.0]], dtype=torch.float64))


def test_gelu_gradcheck_and_values():
    x = double((40,))
    assert gradcheck(gelu, (x,))
    assert gradcheck(gelu_tanh, (x,))
    assert torch.allclose(gelu(x), F.gelu(x), atol=1e-12)
    assert torch.allclose(gelu_tanh(x), F.gelu(x, approximate="tanh"), atol=1e-12)
    # GELU(1) = 1 * Phi(1) = 0.841344746...
    assert abs(gelu(torch.tensor(1.0, dtype=torch.float64)).item() - 0.8413447460685429) < 1e-12


def test_attention_gradcheck_with_padding():
    config = EncoderConfig(**TINY)
    attention = SelfAttention(config).double()
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    positions = mask.flatten().nonzero().squeeze(1)  # 8 real tokens of the 2 x 5 grid
    packed = double((8, 16))
    additive = additive_attention_mask(mask, torch.float64)
    assert gradcheck(lambda x: attention(x, additive, positions), (packed,))


def test_attention_of_a_padded_sentence_is_that_of_the_sentence_alone():
    config = EncoderConfig(**TINY)
    attention = SelfAttention(config).eval()
    tokens = torch.randn(3, 16)  # one sentence of 3 tokens, packed
    alone = attention(tokens, additive_attention_mask(torch.ones(1, 3), tokens.dtype), torch.arange(3))
    # The same sentence padded to 5 beside a full sentence of 5: its 3 outputs must not change.
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    packed = torch.cat([torch.randn(5, 16), tokens])  # (8, 16)
    batched = attention(packed, additive_attention_mask(mask, tokens.dtype), mask.flatten().nonzero().squeeze(1))
    assert torch.allclose(batched[5:], alone, atol=1e-6)


def test_pooling_gradcheck():
    tokens = double((2, 4, 6))
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    assert gradcheck(lambda t: mean_pool(t, mask), (tokens,))
    assert gradcheck(lambda t: max_pool(t, mask), (tokens,))
    assert gradcheck(lambda t: normalize(mean_pool(t, mask)), (tokens,))


def test_pooling_values_skip_padding():
    tokens = torch.tensor([[[1.0, 10.0], [3.0, -2.0], [100.0, 100.0]]])  # (1, 3, 2), last is padding
    mask = torch.tensor([[1, 1, 0]])
    assert torch.equal(mean_pool(tokens, mask), torch.tensor([[2.0, 4.0]]))  # (1+3)/2, (10-2)/2
    assert torch.equal(max_pool(tokens, mask), torch.tensor([[3.0, 10.0]]))
    assert torch.allclose(normalize(torch.tensor([[3.0, 4.0]])), torch.tensor([[0.6, 0.8]]))


def test_fused_path_equals_written_out_path():
    for activation in ("gelu", "gelu_new"):
        for family in ("bert", "roberta", "distilbert"):
            config = EncoderConfig(**{**TINY, "activation": activation, "family": family,
                                      "pad_token_id": 1 if family == "roberta" else 0,
                                      "type_vocab_size": 0 if family == "distilbert" else 2})
            torch.manual_seed(0)
            encoder = Encoder(config).eval()
            ids = torch.randint(2, 50, (3, 7))
            mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
            ids = ids.masked_fill(mask == 0, config.pad_token_id)
            written = encoder(ids, mask)
            encoder.set_fused(True)
            fused = encoder(ids, mask)
            real = mask.bool()
            assert (written[real] - fused[real]).abs().max() <= 1e-6, (family, activation)
            # Without padding the fused path packs nothing and passes no mask.
            full = torch.ones_like(mask)
            unmasked = encoder(ids, full)
            encoder.set_fused(False)
            assert (encoder(ids, full) - unmasked).abs().max() <= 1e-6, (family, activation)


def test_reusing_memory_gives_identical_results_and_keeps_autograd():
    for activation in ("gelu", "gelu_new"):
        config = EncoderConfig(**{**TINY, "activation": activation})
        torch.manual_seed(0)
        encoder = Encoder(config, fused=True).eval()
        ids = torch.randint(2, 50, (3, 7))
        mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
        with torch.no_grad():
            expected = encoder(ids, mask)
            with reusing_memory():
                reused = encoder(ids, mask)
                scratch = encoder_module._scratch.get()[("feed-forward", torch.float32)]
                # A second, longer batch grows the memory; a shorter one reuses it.
                longer = encoder(torch.cat([ids, ids]), torch.cat([mask, mask]))
                again = encoder(ids, mask)
        assert torch.equal(reused, expected) and torch.equal(again, expected), activation
        assert torch.equal(longer, torch.cat([expected, expected])), activation
        assert scratch.numel() == int(mask.sum()) * config.intermediate_size  # 13 tokens x 32
        assert encoder_module._scratch.get() is None  # freed on leaving

        # With autograd on, the path that writes in place is not taken: gradients still flow.
        with reusing_memory():
            encoder(ids, mask).sum().backward()
        gradient = encoder.layers[0].ffn.intermediate.weight.grad.clone()
        encoder.zero_grad()
        encoder(ids, mask).sum().backward()
        assert torch.equal(gradient, encoder.layers[0].ffn.intermediate.weight.grad), activation
