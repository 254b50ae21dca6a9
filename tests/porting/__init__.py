"""Tests of minisbert/porting/: sentence-transformers' calls against sentence-transformers."""
