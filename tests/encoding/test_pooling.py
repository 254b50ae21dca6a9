"""encoding/pooling.py's Dense layer: sentence-transformers' `Dense`, y = act(W x + b), computed here in float64 from
its own weights, with a bias and tanh unless told otherwise, and saved under sentence-transformers' names.
(The pooling functions and the normalisation are checked in tests/encoding/test_encoder_math.py, against
sentence-transformers' embeddings in tests/encoding/test_encoder.py and tests/encoding/test_model.py.)"""

import numpy as np
import pytest
import torch

from minisbert.encoding.pooling import Dense

from ..tolerances import float32_apart, scale

ACTIVATIONS = {"tanh": np.tanh, "identity": lambda x: x, "relu": lambda x: np.maximum(x, 0)}


def reference(dense: Dense, x: torch.Tensor) -> np.ndarray:
    weight = dense.linear.weight.detach().double().numpy()  # (D, H)
    bias = dense.linear.bias.detach().double().numpy() if dense.linear.bias is not None else 0.0
    return ACTIVATIONS[dense.activation_name](x.double().numpy() @ weight.T + bias)  # (B, D)


def test_dense_is_tanh_of_w_x_plus_b_by_default_as_in_sentence_transformers():
    torch.manual_seed(0)
    dense = Dense(6, 4)
    assert dense.activation_name == "tanh"
    assert sorted(dense.state_dict()) == ["linear.bias", "linear.weight"]  # sentence-transformers' names
    x = torch.randn(5, 6)
    expected = reference(dense, x)
    # float32 against float64: one product over H = 6 terms, the bias, tanh (which shrinks differences)
    assert np.abs(dense(x).detach().numpy() - expected).max() <= float32_apart(6 + 2) * scale(expected)


@pytest.mark.parametrize("activation", ["identity", "relu"])
@pytest.mark.parametrize("bias", [True, False])
def test_dense_takes_another_activation_and_no_bias_when_told(activation, bias):
    torch.manual_seed(1)
    dense = Dense(6, 4, bias=bias, activation=activation)
    assert ("linear.bias" in dense.state_dict()) == bias
    x = 3 * torch.randn(5, 6)  # values of both signs for relu
    expected = reference(dense, x)
    assert np.abs(dense(x).detach().numpy() - expected).max() <= float32_apart(6 + 2) * scale(expected)
