"""Tests of minisbert/evaluation/: the metrics, correlations and significance tests against independent references."""
