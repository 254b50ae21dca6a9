"""Prompts: a text put before each input, named in a model's `prompts` dict (e.g. {"query": "query: "}),
as sentence-transformers 6.2 does them.

- A model's prompts start as {"query": "", "document": ""}; the constructor's `prompts` are laid
  over them, and those in the directory's config_sentence_transformers.json fill the names the
  constructor did not give.
- encode(prompt=TEXT) uses TEXT; encode(prompt_name=NAME) uses prompts[NAME]; neither uses the
  prompt named by `default_prompt_name`, if any.
- encode_query uses the "query" prompt; encode_document the first of "document", "passage",
  "corpus" the model has. Since "query" and "document" are always there, these two never fall back
  to `default_prompt_name`.
- The prompt is prepended to the text and tokenized with it, and its tokens are pooled with the
  text's (pooling's `include_prompt`, true for every model minisbert reads).
- A retrieval evaluation (evaluate.py, its sharded search, hard-negative mining) encodes queries
  with encode_query and documents with encode_document (`encode_as`), as sentence-transformers'
  InformationRetrievalEvaluator does; cached corpus embeddings are kept under their document prompt.

Checked against sentence-transformers' encode, encode_query and encode_document on
all-MiniLM-L6-v2 in tests/porting/test_st_calls.py.
"""

DEFAULT_PROMPTS = {"query": "", "document": ""}
QUERY_PROMPT_NAME = "query"
DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")


def model_prompts(given: dict | None, saved: dict) -> dict:
    """The prompts a model starts with: the defaults, the constructor's `given`, then `saved` (from
    the model directory) for the names not given."""
    prompts = {**DEFAULT_PROMPTS, **check_prompts(given or {}, "prompts")}
    for name, text in check_prompts(saved, "the directory's prompts").items():
        if name not in (given or {}):
            prompts[name] = text
    return prompts


def check_prompts(prompts, what: str) -> dict:
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ValueError(f"{what} must be a dict of prompt name -> prompt text (both str), got {prompts!r:.80}")
    return prompts


def check_default_prompt_name(prompts: dict, name) -> None:
    if name is not None and name not in prompts:
        raise ValueError(f"default_prompt_name {name!r} is not one of the model's prompts {list(prompts)}; "
                         "add it to `prompts` first, or pass None")


def resolve_prompt(prompts: dict, default_prompt_name, prompt, prompt_name) -> str:
    """The text to put before each input ("" for none)."""
    if prompt is not None and prompt_name is not None:
        raise ValueError(f"encode() got both prompt={prompt!r} and prompt_name={prompt_name!r}; give one of them "
                         "(sentence-transformers warns and uses prompt)")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        return prompt
    if prompt_name is not None:
        if prompt_name not in prompts:
            raise ValueError(f"prompt_name {prompt_name!r} is not one of the model's prompts {list(prompts)}; "
                             "add it with model.prompts[NAME] = TEXT or pass prompt=TEXT")
        return prompts[prompt_name]
    return prompts.get(default_prompt_name, "") if default_prompt_name is not None else ""


def document_prompt_name(prompts: dict) -> str | None:
    """encode_document's prompt: the first of DOCUMENT_PROMPT_NAMES the model has."""
    return next((name for name in DOCUMENT_PROMPT_NAMES if name in prompts), None)


def encode_as(model, texts, role: str, **options):
    """`texts` encoded as queries or as documents (role "query" or "document"): with the model's
    encode_query or encode_document where it has them (a sentence-transformers model's prompts for
    each side, as sentence-transformers' InformationRetrievalEvaluator encodes them), else encode."""
    return getattr(model, f"encode_{role}", model.encode)(texts, **options)


def role_prompt(model, role: str | None) -> str:
    """The prompt `encode_as` puts before a text of this role ("query", "document"), or, for None,
    the one plain encode() puts (the model's default prompt): "" where there is none."""
    prompts = getattr(model, "prompts", {})
    if role is None:
        name = getattr(model, "default_prompt_name", None)
    else:
        name = QUERY_PROMPT_NAME if role == "query" else document_prompt_name(prompts)
    return prompts.get(name, "") if name else ""
