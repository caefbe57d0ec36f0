"""Print each cProfile file's functions by own time (and the merged total of all files given):
python bench/_debug/prof_top.py N FILE... (N rows per file)."""
import pstats
import sys

n, files = int(sys.argv[1]), sys.argv[2:]
for f in files:
    s = pstats.Stats(f)
    print(f"===== {f}: {s.total_tt:.3f} s profiled")
    s.sort_stats("tottime").print_stats(n)
