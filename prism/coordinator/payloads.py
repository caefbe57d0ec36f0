"""Recorded comm payloads: the store lives in :mod:`prism.graph.payloads` (the sandbox's replay
engine and ``prism record --payloads`` use it too); re-exported here for the coordinator."""

from prism.graph.payloads import (PayloadPolicy, PayloadStore, load_index, load_payload, op_key, payload_hash,
                                  write_error)

__all__ = ["PayloadPolicy", "PayloadStore", "payload_hash", "load_payload", "load_index", "op_key", "write_error"]
