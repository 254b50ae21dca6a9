"""minisbert: Sentence-BERT written out by hand, checked number by number against the reference.

    import minisbert
    model = minisbert.load("all-MiniLM-L6-v2")        # fetched into weights/ on first use
    embeddings = model.encode(["A man is eating food.", "A man is eating a piece of bread."])

Files, one concept each: config (model shape), encoder (the transformer), weights (checkpoint names),
tokenizer, pooling, model (the network: encode/save/load), precision (dtype and device rules),
st_directory (the sentence-transformers layout), hub (which weights, from where), download (one file,
checked), similarity (cosine and distances), losses, optim, fit (the training loop), datasets/
(readers, TREC files, and where each dataset is found), retrieval, metrics, correlation (STS),
significance, lexical (BM25, Jaccard), evaluation, experiments/ (the papers' studies); for code
ported from sentence-transformers, sentence_transformer (its class's calls, over the network),
prompts, quantize, porting (what is refused) and util. Speed machinery sits beside the plain code in
minisbert/fast/; backend says which path runs a model fast.
"""


def load(name_or_path, device=None, fast: bool = True, **st_options):
    """A known model name (fetched on first use), a sentence-transformers directory, or a plain
    Hugging Face model directory -> the model, with sentence-transformers' calls
    (sentence_transformer.py). device: None picks cuda, then mps, then cpu.
    fast: plug in the fast path (minisbert/fast/encode.py: the fast encoder and batching) or, with
    False, run the plain network (model.py, encoder.py) alone. Either way a text gets the same
    embedding whatever batch it is encoded in.
    st_options: sentence-transformers' truncate_dim, prompts, default_prompt_name, similarity_fn_name."""
    from .backend import default_fast_path
    from .hub import resolve
    from .sentence_transformer import SentenceTransformer as Model

    fast_path = default_fast_path() if fast else None
    return Model.from_dir(resolve(name_or_path), device=device, fast_path=fast_path, **st_options)


def SentenceTransformer(model_name_or_path, device=None, *, truncate_dim=None, prompts=None,  # noqa: N802
                        default_prompt_name=None, similarity_fn_name=None, **unsupported):
    """sentence-transformers' constructor, by name, so that its snippets run with the import changed
    (`from minisbert import SentenceTransformer`): the same as load(), with the constructor's
    truncate_dim, prompts, default_prompt_name and similarity_fn_name (None: the directory's).
    Its other arguments are refused by name. Returns minisbert.sentence_transformer.SentenceTransformer,
    whose encode() and similarity() take sentence-transformers' arguments; README.md lists where
    minisbert differs."""
    if unsupported:
        raise TypeError(f"minisbert's SentenceTransformer() does not support the argument(s) {sorted(unsupported)}; "
                        "it takes model_name_or_path, device, truncate_dim, prompts, default_prompt_name and "
                        "similarity_fn_name")
    return load(model_name_or_path, device=device, truncate_dim=truncate_dim, prompts=prompts,
                default_prompt_name=default_prompt_name, similarity_fn_name=similarity_fn_name)


def __getattr__(name):
    # Imported on first use, so `python -m minisbert.weights` does not find weights already loaded.
    if name == "default_fast_path":  # minisbert/backend.py's: the path load() plugs in
        from .backend import default_fast_path

        return default_fast_path
    if name == "SentenceModel":
        from .model import SentenceModel

        return SentenceModel
    raise AttributeError(f"module 'minisbert' has no attribute {name!r}")


__all__ = ["load", "SentenceModel", "SentenceTransformer"]
