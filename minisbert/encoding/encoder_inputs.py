"""What an encoder computes from a padded batch before its first layer: each token's position id,
and the additive attention mask that keeps padding out of attention.

Position ids are shared by the plain encoder (encoding/encoder.py) and the fast one (encoding/fast/tiled_encoder.py), so
both number positions the same way; the fast one needs no mask, as it attends to each text at its
own length. Position ids are checked against those transformers'
RobertaModel computes in tests/encoding/test_encoder.py; the mask in tests/encoding/test_encoder_math.py.
"""

import torch

from .config import EncoderConfig


def position_ids(input_ids, config: EncoderConfig):
    """(B, T) token ids -> (B, T) rows of the position table.

    BERT and DistilBERT number the tokens 0, 1, 2, ... RoBERTa (`positions_after_pad`) counts real
    tokens from pad_token_id + 1 and gives every padding token the padding row, as fairseq did, so a
    sentence gets the same positions wherever its padding is.
    """
    if not config.positions_after_pad:
        T = input_ids.shape[1]
        return torch.arange(T, device=input_ids.device).expand_as(input_ids)  # (B, T)
    is_token = (input_ids != config.pad_token_id).long()  # (B, T)
    return torch.cumsum(is_token, dim=1) * is_token + config.pad_token_id  # (B, T)


def additive_attention_mask(attention_mask, dtype):
    """(B, T) of 1 = token, 0 = padding  ->  (B, 1, 1, T) of 0 = attend, dtype minimum = ignore.

    Added to the attention scores before the softmax, it gives padding keys a weight of zero. The most
    negative finite number rather than -inf: a row whose keys are all padding then gets a uniform
    softmax (as transformers computes it) instead of 0/0 = NaN.
    """
    blocked = (attention_mask == 0)[:, None, None, :]  # (B, 1, 1, T)
    return torch.zeros(blocked.shape, dtype=dtype, device=attention_mask.device).masked_fill(
        blocked, torch.finfo(dtype).min
    )
