"""The plain encoder's pieces on their own: each one's values and gradient, the attention mask.

gradcheck compares autograd's gradient with finite differences in float64; if a hand-written
function had a mistake that autograd faithfully differentiated, the parity tests catch it instead
(tests/encoding/test_encoder.py). Here we learn that each piece is smooth and differentiable as written.
gradcheck keeps torch's tolerances (atol 1e-5, rtol 1e-3): a central difference with step 1e-6 errs
by about step² (1e-12) from truncation and u / step (1e-10) from rounding; measured here, within 5e-10.
"""

import torch
import torch.nn.functional as F
from torch.autograd import gradcheck

from minisbert.encoding.config import EncoderConfig
from minisbert.encoding.encoder import SelfAttention, gelu, gelu_tanh, layer_norm
from minisbert.encoding.encoder_inputs import additive_attention_mask
from minisbert.encoding.pooling import max_pool, mean_pool, normalize

from ..tolerances import float32_apart, scale

TINY = dict(family="bert", vocab_size=50, hidden_size=16, num_layers=2, num_heads=4, intermediate_size=32,
            max_position_embeddings=20, type_vocab_size=2, layer_norm_eps=1e-12, activation="gelu",
            pad_token_id=0, hidden_dropout=0.0, attention_dropout=0.0, positions_after_pad=False)


def double(shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True)


def test_layer_norm_gradcheck():
    x, w, b = double((3, 5, 8)), double((8,), 1), double((8,), 2)
    assert gradcheck(lambda x, w, b: layer_norm(x, w, b, 1e-5), (x, w, b))


def test_layer_norm_equals_torch_and_uses_biased_variance():
    x, w, b = double((3, 5, 8)), double((8,), 1), double((8,), 2)
    expected = F.layer_norm(x, (8,), w, b, 1e-12)
    # float64, the same sums over H = 8 in another order: a few ulps of values up to 5 (measured 4e-16)
    assert torch.allclose(layer_norm(x, w, b, 1e-12), expected, rtol=0, atol=1e-12)
    # With var computed as /(H-1) the result would differ by a factor sqrt(8/7):
    row = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    # mean 2, biased variance ((1-2)^2 + (3-2)^2)/2 = 1, so the output is (-1, 1): small integers, exact
    assert torch.equal(layer_norm(row, torch.ones(2), torch.zeros(2), 0.0), torch.tensor([[-1.0, 1.0]], dtype=torch.float64))


def test_gelu_gradcheck_and_values():
    x = double((40,))
    assert gradcheck(gelu, (x,))
    assert gradcheck(gelu_tanh, (x,))
    # float64 erf and tanh, here and in torch's kernels: a few ulps of values up to 3 (measured 1.3e-16)
    assert torch.allclose(gelu(x), F.gelu(x), rtol=0, atol=1e-12)
    assert torch.allclose(gelu_tanh(x), F.gelu(x, approximate="tanh"), rtol=0, atol=1e-12)
    # GELU(1) = 1 * Phi(1) = 0.841344746..., to float64's 16 digits
    assert abs(gelu(torch.tensor(1.0, dtype=torch.float64)).item() - 0.8413447460685429) < 1e-12


def test_attention_gradcheck_with_padding():
    config = EncoderConfig(**TINY)
    attention = SelfAttention(config).double()
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    additive = additive_attention_mask(mask, torch.float64)
    assert gradcheck(lambda x: attention(x, additive), (double((2, 5, 16)),))


def test_attention_of_a_padded_sentence_is_that_of_the_sentence_alone():
    config = EncoderConfig(**TINY)
    attention = SelfAttention(config).eval()
    tokens = torch.randn(1, 3, 16)  # one sentence of 3 tokens
    alone = attention(tokens, additive_attention_mask(torch.ones(1, 3), tokens.dtype))
    # The same sentence padded to 5 beside a full sentence of 5: its 3 outputs must not change,
    # whatever the padding holds.
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    padded = torch.cat([tokens, 100 * torch.randn(1, 2, 16)], dim=1)  # (1, 5, 16)
    batch = torch.cat([torch.randn(1, 5, 16), padded])  # (2, 5, 16)
    batched = attention(batch, additive_attention_mask(mask, tokens.dtype))
    # The same sums over H = 16 and the tokens in another blocking: two float32 computations apart.
    assert torch.allclose(batched[1, :3], alone[0], rtol=0, atol=float32_apart(4 * 16) * scale(alone))


def test_additive_mask_blocks_padding_and_an_all_padding_row_stays_finite():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    additive = additive_attention_mask(mask, torch.float32)  # (2, 1, 1, 3)
    lowest = torch.finfo(torch.float32).min
    assert additive.shape == (2, 1, 1, 3)
    assert additive[0, 0, 0].tolist() == [0.0, 0.0, lowest]
    probs = torch.softmax(torch.zeros(2, 1, 1, 3) + additive, dim=-1)
    assert probs[0, 0, 0].tolist() == [0.5, 0.5, 0.0]  # padding gets no weight at all
    # uniform, not 0/0 = NaN: exp(0) / 3 in float32, a rounding or two (tolerances.py)
    assert torch.allclose(probs[1, 0, 0], torch.full((3,), 1 / 3), rtol=0, atol=float32_apart(3))


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
    # the norm is 5 exactly, and each division rounds once, as the literals do
    assert torch.equal(normalize(torch.tensor([[3.0, 4.0]])), torch.tensor([[0.6, 0.8]]))
