"""The fast search's tuning numbers, in one place. Each changes only speed and memory, never a result
(every result is decided by the exact rescoring: minisbert/search/plain.py). Each line says why; the
measurements behind them are in bench/README.md, in the section named after "bench:".
"""

# Which way a search takes (minisbert/search/ways.py's WAYS), and what a fast way keeps.
SMALL_CORPUS_ROWS = 16384  # up to this many rows one float32 block is quickest. bench: "Search", small corpora
FEW_QUERIES = 128  # up to this many queries the corpus is read a span at a time. bench: "Search"
FEW_QUERIES_INT8 = 64  # ... where the blocks screen with int8 products. bench: "Search"
SCREENED_FEW_QUERIES = 4  # one query, and from this many, spans are screened with an int8 copy. bench: "Search"
INT8_ROWS_RATIO = 0.75  # a prepared corpus keeps an int8 copy where its product takes under this share of float32's
INT8_BLOCKS_RATIO = 0.6  # the int8 blocks screen where their product takes under this share of float32's
KEPT_BEYOND_K = 16  # a fast way keeps its top k + this many: the rows past the k-th prove the top k. bench: "Search"
HALF_KEPT_BEYOND_K = 48  # ... the float16 screen, whose error is 2^13 times float32's: more rows, fewer unproved

DEVICE_BLOCK_ENTRIES = 2**28  # a device block's (Qc, n) float32 scores: 1 GB. bench: "GPUs"
# Kept rows' numbers a device scores exactly at once (256 MB a float64 copy): one piece for 1,024 queries
# keeping up to 85 rows of d = 384, pieces for k near N (without them, Q x N x d numbers).
DEVICE_RESCORE_ENTRIES = 2**25

# Spans of the few-query search (search/fast/spans_blocks.py's `search_spans`).
GROUP_SIZE = 64  # corpus rows per group of the coarse filter: one group maximum opens or skips 64 scores
SPAN_ROWS = 2**19 - GROUP_SIZE  # long spans (a few dozen torch calls each); no multiple of 4096: cache sets
SPAN_ENTRIES = 2**22  # a span's (Q, span) float32 scores: at most 16 MB
FIRST_SPAN_ROWS = 4096 - GROUP_SIZE  # the first span is short, so that the k-th best is known early
SPAN_GROWTH = 4  # a screened search's spans grow this many times a step, each meeting a k-th best high enough
NORM_PIECE_ROWS = 2048  # raw rows are measured a piece at a time, in the cache after its product. bench: "Search, norms"
PIECE_BYTES = 64 * 2**20  # a corpus stored in another dtype is copied to float32 this many bytes at a time
PIECE_ENTRIES = 2**16  # entries of a (piece, Q') product the span product copies while in the L2 cache

# Screens (search/fast/screen.py, search/fast/int8_blocks.py, search/fast/int8_rows.py).
RESCORE_PIECE = 1024  # candidates rescored in float32 at once: 1.5 MB of gathered rows for d = 384
INT8_PIECE_ROWS = 1024  # rows of a chunk that share one int8 scale (a whole number of groups)
MOST_CANDIDATES = 1 / 64  # a span whose candidates pass this share of its entries is scored in float32
# An opened entry costs about a sixth of a float32 one, a candidate rescored alone fifty. bench: "Search", block filter
MOST_OPENED, MOST_SCREENED = 1 / 2, 1 / 128  # a block opening or passing more entries is scored in float32
INT8_COPY_PIECE_ROWS = 8192  # rows of a prepared corpus quantized at once when its int8 copy is made

# Probes that measure a fact once per machine (common/machine.py).
PROBE_BYTES = 2**26  # float32 rows of a timing probe: more than a 2-core machine's caches hold
PROBE_FLOP = 2**30  # ... unless that would take more than this many FLOP per product
