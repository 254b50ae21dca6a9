"""Tests of minisbert/datasets/: the dataset readers."""
