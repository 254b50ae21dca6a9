"""Exact top-k search: the plain loop first, the search the library calls beside it.

The plain loop (plain.py, with the checks and exact rescoring of inputs.py and the error bounds of
bounds.py), the search the library calls (ways.py: the table of ways, prepared corpora), its faster
ways in fast/.

    from minisbert.search import search, prepare_corpus, load_corpus

The names below are ways.py's, imported on first use, so that the plain loop can be imported (and
read) without the fast ways: `minisbert.search.plain` loads nothing from fast/.
"""

PUBLIC = ("search", "prepare_corpus", "load_corpus", "PreparedCorpus", "WAYS", "WAY_NAMES", "choose_way",
          "explain_way", "recorded_ways", "WayChoice")


def __getattr__(name):
    if name in PUBLIC:
        from . import ways

        return getattr(ways, name)
    raise AttributeError(f"module 'minisbert.search' has no attribute {name!r}")


__all__ = list(PUBLIC)
