"""Tests of minisbert/training/: the losses, the optimizer, the training loop, checkpoints, torchrun."""
