"""The encoder's configuration: the shape of a BERT, DistilBERT or RoBERTa model, one frozen dataclass.

The three families differ in what follows (as transformers' BertModel, DistilBertModel and
RobertaModel compute them; tests/encoding/test_encoder.py checks all three):
- LayerNorm eps: 1e-12 for BERT and DistilBERT, 1e-5 for fairseq RoBERTa.
- RoBERTa numbers positions from `pad_token_id + 1` and gives padding the padding row, as fairseq
  did (`positions_after_pad` below); BERT and DistilBERT number them 0, 1, 2, ...
- DistilBERT has no token-type embeddings (`type_vocab_size` 0).

Hugging Face's `config.json` spells these fields differently in each family; encoding/weights.py reads and
writes them (`config_from_hf`, `config_to_hf`) beside the families' weight names.
"""

from dataclasses import dataclass, fields

FAMILIES = ("bert", "distilbert", "roberta")
GELU_VARIANTS = ("gelu", "gelu_new")  # exact erf GELU, and the tanh approximation


@dataclass(frozen=True)
class EncoderConfig:
    family: str  # "bert", "distilbert" or "roberta": decides only the checkpoint name table
    vocab_size: int  # rows of the token embedding table
    hidden_size: int  # width of every token vector (H)
    num_layers: int  # transformer blocks
    num_heads: int  # attention heads; hidden_size must divide evenly between them
    intermediate_size: int  # width of the feed-forward layer (usually 4 H)
    max_position_embeddings: int  # rows of the position table (RoBERTa: 514 = 512 + pad + 1)
    type_vocab_size: int  # rows of the token-type table; 0 means there is none (DistilBERT)
    layer_norm_eps: float  # added to the variance inside the square root
    activation: str  # "gelu" (exact) or "gelu_new" (tanh approximation)
    pad_token_id: int  # id of the padding token
    hidden_dropout: float  # dropout on embeddings and on each sublayer's output (training only)
    attention_dropout: float  # dropout on attention probabilities (training only)
    positions_after_pad: bool  # real tokens numbered from pad_token_id + 1, padding gets row pad_token_id (RoBERTa)

    def __post_init__(self):
        for field in fields(self):  # a wrong-typed value would fail later, far from config.json
            value = getattr(self, field.name)
            numeric_ok = field.type is float and isinstance(value, int)
            if isinstance(value, bool) != (field.type is bool) or not (isinstance(value, field.type) or numeric_ok):
                raise ValueError(f"config field {field.name} must be {field.type.__name__}, got {value!r}")
        if self.family not in FAMILIES:
            raise ValueError(f"unknown model family {self.family!r}; minisbert supports {FAMILIES}")
        if self.activation not in GELU_VARIANTS:
            raise ValueError(
                f"unsupported activation {self.activation!r}; minisbert supports {GELU_VARIANTS}"
            )
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(
                f"hidden size {self.hidden_size} is not divisible by the number of attention heads "
                f"{self.num_heads}"
            )
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"config field {name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"config field pad_token_id {self.pad_token_id} is not a row of the "
                             f"{self.vocab_size}-row token embedding table")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def position_offset(self) -> int:
        """First position id of a real token: after the padding row, or 0."""
        return self.pad_token_id + 1 if self.positions_after_pad else 0

    @property
    def max_tokens(self) -> int:
        """The longest input (special tokens included) the position table can number."""
        return self.max_position_embeddings - self.position_offset
