"""Generated protobuf code (scripts/gen_protos.py). Do not edit."""
