"""nccl_patches."""
