"""Tests of minisbert/common/: what every job shares: unit rows and scores, files, the hub, downloads."""
