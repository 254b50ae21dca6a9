"""Which path runs a model fast, chosen in one place: what `minisbert.load` plugs in and what a
`SentenceTransformer` built in memory gets, so that a model built and the same model saved and
loaded give the same bits. fast/ is imported only when the default is asked for: the plain network
(encoding/model.py, encoding/encoder.py) runs without it.
"""


def default_fast_path():
    """The fast path a model runs unless told otherwise (minisbert/encoding/fast/batching.py's FAST_PATH)."""
    from .fast.batching import FAST_PATH

    return FAST_PATH
