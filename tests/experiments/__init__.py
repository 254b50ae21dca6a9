"""Tests of minisbert/experiments/: the papers' studies and their write-ups."""
