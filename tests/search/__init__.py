"""Tests of minisbert/search/: the search: the plain loop against its definition, every way against it, the bounds."""
