"""vrank_replayer."""
