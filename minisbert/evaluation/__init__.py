"""Evaluating a model: metrics, correlations, significance, and scoring with a model.

Information-retrieval metrics at k (metrics), STS correlations (correlation), paired tests and Holm
(significance), BM25 and Jaccard (lexical), evaluate.py's tables, and ranking or scoring with a
model (benchmark).
"""
