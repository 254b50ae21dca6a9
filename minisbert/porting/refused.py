"""What a user porting sentence-transformers code meets that minisbert does not do: refused loudly,
never ignored.

sentence-transformers' SentenceTransformer has attributes and encode() arguments minisbert does not
implement. Setting such an attribute on a minisbert model, or passing such an argument, raises an
error that names it and says what to do instead; otherwise a line of ported code would run and
change nothing. The attributes and arguments minisbert does implement (max_seq_length,
truncate_dim, prompts, default_prompt_name, similarity_fn_name; prompt, prompt_name, precision,
output_value, truncate_dim, ...) are in porting/sentence_transformer.py.

Checked in tests/porting/test_st_calls.py.
"""

from .quantize import PRECISIONS

OUTPUT_VALUES = ("sentence_embedding", "token_embeddings")

# sentence-transformers attributes with a meaning there and none here -> what to do instead.
UNSUPPORTED_ATTRIBUTES = {
    "model_card_data": "minisbert writes no model card",
    "backend": "minisbert runs torch only (no onnx or openvino)",
    "trust_remote_code": "minisbert runs only its own code, never a model directory's",
    "module_kwargs": "minisbert's modules take no extra forward arguments",
    "processor": "the tokenizer is model.tokenizer (minisbert/encoding/tokenizer.py)",
    "do_lower_case": "lowercasing is part of the tokenizer read from the model directory",
    "include_prompt": "prompt tokens are always pooled with the text (minisbert/porting/prompts.py)",
}
# sentence-transformers encode() arguments minisbert does not take -> what to do instead.
UNSUPPORTED_ENCODE_ARGUMENTS = {
    "device": "move the model instead: model.to(device)",
    "pool": "minisbert encodes in one process; call encode() without a pool",
    "chunk_size": "minisbert encodes in one process; leave it out",
    "task": "minisbert's models have no task routes; leave it out",
    "processing_kwargs": "to cut texts at N tokens set model.max_seq_length = N",
    "inputs": "pass the texts as the first argument (minisbert calls it sentences)",
}


def refuse_attribute(name: str) -> None:
    """A clear error if `name` is a sentence-transformers attribute minisbert does not implement."""
    if name in UNSUPPORTED_ATTRIBUTES:
        raise AttributeError(f"minisbert does not support sentence-transformers' attribute {name!r}: setting it "
                             f"would change nothing. {UNSUPPORTED_ATTRIBUTES[name]}")


def refuse_encode_arguments(arguments: dict) -> None:
    """A clear error naming the keyword arguments encode() was given and does not take."""
    if arguments:
        hints = "; ".join(f"{name}: {UNSUPPORTED_ENCODE_ARGUMENTS.get(name, 'not an argument of encode()')}"
                          for name in arguments)
        raise TypeError(f"minisbert's encode() does not support the argument(s) {sorted(arguments)} "
                        f"({hints})")


def check_output(output_value: str, precision: str, normalize_embeddings: bool, truncate_dim) -> None:
    """encode()'s output_value and precision, and the options token embeddings do not take."""
    if output_value not in OUTPUT_VALUES:
        raise ValueError(f"output_value must be one of {OUTPUT_VALUES}, got {output_value!r} (minisbert does not "
                         "return sentence-transformers' dicts of every output)")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if output_value == "token_embeddings" and (precision != "float32" or normalize_embeddings or truncate_dim):
        raise ValueError("output_value='token_embeddings' returns the encoder's token vectors as they are: "
                         "precision, normalize_embeddings and truncate_dim apply to sentence embeddings only; "
                         "leave them out")


def checked_truncate_dim(truncate_dim):
    """None (keep every dimension) or a positive int."""
    if truncate_dim is not None and (isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int)
                                     or truncate_dim <= 0):
        raise ValueError(f"truncate_dim must be a positive int or None, got {truncate_dim!r}")
    return truncate_dim

