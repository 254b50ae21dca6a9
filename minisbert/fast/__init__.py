"""Speed machinery, beside the plain code it speeds up: each module here computes what a plain
module of minisbert/ computes, is tested equal to it, and is never imported by it."""
