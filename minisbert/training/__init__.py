"""Learning the network: losses, optimizer, the loop and its checkpoints.

The losses, the optimizer and schedule (optim), the training loop (fit) and what it keeps
(checkpoints), examples in the shape each loss reads (training_data), torchrun past one process
(distributed).
"""
