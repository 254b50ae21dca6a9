"""The encoder's configuration: one frozen dataclass for BERT, DistilBERT and RoBERTa.

Hugging Face stores a model's shape in `config.json`, but the three families spell it differently:
DistilBERT says `dim`, `n_layers`, `n_heads`, `hidden_dim` and `activation` where BERT and RoBERTa say
`hidden_size`, `num_hidden_layers`, `num_attention_heads`, `intermediate_size` and `hidden_act`.
`EncoderConfig.from_hf` reads any of the three into one set of names, so the model code never asks
which family it is running, and `to_hf` writes the family's own spelling back for saving.

Family differences that change the arithmetic (as transformers' BertModel, DistilBertModel and
RobertaModel compute them; tests/test_encoder.py checks all three):
- LayerNorm eps: BERT and RoBERTa read `layer_norm_eps` (1e-12 for BERT, 1e-5 for fairseq RoBERTa);
  DistilBERT's is fixed at 1e-12 and absent from its config.
- RoBERTa numbers positions from `pad_token_id + 1` and gives padding the padding row, as fairseq
  did (`positions_after_pad` below); BERT and DistilBERT number them 0, 1, 2, ...
- DistilBERT has no token-type embeddings (`type_vocab_size` 0).
"""

from dataclasses import dataclass, fields

FAMILIES = ("bert", "distilbert", "roberta")
ACTIVATIONS = ("gelu", "gelu_new")  # exact erf GELU, and the tanh approximation


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
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"unsupported activation {self.activation!r}; minisbert supports {ACTIVATIONS}"
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

    @classmethod
    def from_hf(cls, hf: dict) -> "EncoderConfig":
        """Read a Hugging Face `config.json` dict of model_type bert, distilbert or roberta."""
        if not isinstance(hf, dict):
            raise ValueError(f"config.json must hold a JSON object of fields, got {type(hf).__name__}")
        family = hf.get("model_type")
        if family not in FAMILIES:
            raise ValueError(
                f"unknown model_type {family!r} in config.json; minisbert supports {FAMILIES}"
            )
        try:
            if family == "distilbert":
                return cls(
                    family=family,
                    vocab_size=hf["vocab_size"],
                    hidden_size=hf["dim"],
                    num_layers=hf["n_layers"],
                    num_heads=hf["n_heads"],
                    intermediate_size=hf["hidden_dim"],
                    max_position_embeddings=hf["max_position_embeddings"],
                    type_vocab_size=0,
                    layer_norm_eps=1e-12,
                    activation=hf.get("activation", "gelu"),
                    pad_token_id=hf.get("pad_token_id", 0),
                    hidden_dropout=hf.get("dropout", 0.1),
                    attention_dropout=hf.get("attention_dropout", 0.1),
                    positions_after_pad=False,
                )
            return cls(
                family=family,
                vocab_size=hf["vocab_size"],
                hidden_size=hf["hidden_size"],
                num_layers=hf["num_hidden_layers"],
                num_heads=hf["num_attention_heads"],
                intermediate_size=hf["intermediate_size"],
                max_position_embeddings=hf["max_position_embeddings"],
                type_vocab_size=hf.get("type_vocab_size", 2),
                layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
                activation=hf.get("hidden_act", "gelu"),
                pad_token_id=hf.get("pad_token_id", 1 if family == "roberta" else 0),
                hidden_dropout=hf.get("hidden_dropout_prob", 0.1),
                attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
                positions_after_pad=family == "roberta",  # fairseq's numbering, kept by RobertaModel
            )
        except KeyError as missing:
            raise ValueError(f"config.json of a {family} model lacks the field {missing}") from None

    def to_hf(self) -> dict:
        """The family's own `config.json` fields, so Hugging Face tools can load a saved model."""
        if self.family == "distilbert":
            return {
                "model_type": "distilbert",
                "architectures": ["DistilBertModel"],
                "vocab_size": self.vocab_size,
                "dim": self.hidden_size,
                "n_layers": self.num_layers,
                "n_heads": self.num_heads,
                "hidden_dim": self.intermediate_size,
                "max_position_embeddings": self.max_position_embeddings,
                "activation": self.activation,
                "pad_token_id": self.pad_token_id,
                "dropout": self.hidden_dropout,
                "attention_dropout": self.attention_dropout,
                "sinusoidal_pos_embds": False,
            }
        architecture = "BertModel" if self.family == "bert" else "RobertaModel"
        return {
            "model_type": self.family,
            "architectures": [architecture],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size,
            "layer_norm_eps": self.layer_norm_eps,
            "hidden_act": self.activation,
            "pad_token_id": self.pad_token_id,
            "hidden_dropout_prob": self.hidden_dropout,
            "attention_probs_dropout_prob": self.attention_dropout,
            "position_embedding_type": "absolute",
        }
