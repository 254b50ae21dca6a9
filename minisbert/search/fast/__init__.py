"""The search's faster ways, each ending in the plain loop's exact rescoring.

Spans and blocks with a coarse filter (spans_blocks), the screens (screen, int8_rows, int8_blocks),
the few-query product (span_product), the GPU way (device), and the tuning numbers in one ledger
(tuning).
"""
