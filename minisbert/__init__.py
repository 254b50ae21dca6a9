"""minisbert: Sentence-BERT written out by hand, checked number by number against the reference.

    import minisbert
    model = minisbert.load("all-MiniLM-L6-v2")        # fetched into weights/ on first use
    embeddings = model.encode(["A man is eating food.", "A man is eating a piece of bread."])

Folders by job, each with its plain rooms first and its fast room (fast/) beside them:

    encoding/     config, tokenizer, the transformer (encoder), pooling, the network (model: encode,
                  save, load), checkpoint names (weights), the sentence-transformers layout; fast/
    training/     losses, optim, the loop (fit), checkpoints, examples (training_data), torchrun
    search/       the search the library calls (search/ways.py), the plain loop (plain), the
                  checks and exact rescoring (inputs), the error bounds (bounds); fast/
    evaluation/   ranking and STS with a model (evaluation/benchmark.py), metrics, correlation,
                  significance, lexical (BM25, Jaccard), tables
    porting/      sentence-transformers' calls: its class, prompts, precision=, util, what is refused
    common/       what every job shares: files, progress, the CPU and its facts, precision, unit rows
                  and exact scores, fetching weights, torch's elementwise functions settled at import
    datasets/     readers and where each dataset is found
    experiments/  the papers' studies, apart from the library a user imports

The plain rooms never import a fast one: `load` plugs the fast path in (encoding/backend.py).
"""

from .common import vector_math as _vector_math

_vector_math.settle()  # torch's elementwise functions, before any call that splits across threads


def load(name_or_path, device=None, fast: bool = True, **st_options):
    """A known model name (fetched on first use), a sentence-transformers directory, or a plain
    Hugging Face model directory -> the model, with sentence-transformers' calls
    (porting/sentence_transformer.py). device: None picks cuda, then mps, then cpu.
    fast: plug in the fast path (minisbert/encoding/fast/batching.py: the fast encoder and batching) or, with
    False, run the plain network (encoding/model.py, encoding/encoder.py) alone. Either way a text gets the same
    embedding whatever batch it is encoded in.
    st_options: sentence-transformers' truncate_dim, prompts, default_prompt_name, similarity_fn_name."""
    from .encoding.backend import default_fast_path
    from .common.hub import resolve
    from .porting.sentence_transformer import SentenceTransformer as Model

    fast_path = default_fast_path() if fast else None
    return Model.from_dir(resolve(name_or_path), device=device, fast_path=fast_path, **st_options)


def SentenceTransformer(model_name_or_path, device=None, *, truncate_dim=None, prompts=None,  # noqa: N802
                        default_prompt_name=None, similarity_fn_name=None, **unsupported):
    """sentence-transformers' constructor, by name, so that its snippets run with the import changed
    (`from minisbert import SentenceTransformer`): the same as load(), with the constructor's
    truncate_dim, prompts, default_prompt_name and similarity_fn_name (None: the directory's).
    Its other arguments are refused by name. Returns minisbert.porting.sentence_transformer.SentenceTransformer,
    whose encode() and similarity() take sentence-transformers' arguments; README.md lists where
    minisbert differs."""
    if unsupported:
        raise TypeError(f"minisbert's SentenceTransformer() does not support the argument(s) {sorted(unsupported)}; "
                        "it takes model_name_or_path, device, truncate_dim, prompts, default_prompt_name and "
                        "similarity_fn_name")
    return load(model_name_or_path, device=device, truncate_dim=truncate_dim, prompts=prompts,
                default_prompt_name=default_prompt_name, similarity_fn_name=similarity_fn_name)


def __getattr__(name):
    # Imported on first use, so `python -m minisbert.encoding.weights` does not find weights already loaded.
    if name == "util":  # `from minisbert import util`, as sentence-transformers' `from sentence_transformers import util`
        from .porting import util

        return util
    if name == "default_fast_path":  # minisbert/encoding/backend.py's: the path load() plugs in
        from .encoding.backend import default_fast_path

        return default_fast_path
    if name == "SentenceModel":
        from .encoding.model import SentenceModel

        return SentenceModel
    raise AttributeError(f"module 'minisbert' has no attribute {name!r}")


__all__ = ["load", "SentenceModel", "SentenceTransformer", "util"]
