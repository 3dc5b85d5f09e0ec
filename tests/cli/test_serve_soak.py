"""Soak test of `sparse-engine serve`: 1,000 requests of serve_soak.py's mix (streams, abandoned streams, tool calls,
json_schema output, chains with prunes, bad inputs) against a server whose small KV cache forces preemption;
afterwards every KV page is back, nothing runs or waits, and the server still answers."""
from serve_soak import SERVER_ARGS, soak
from server_process import ServerProcess


def test_soak_of_mixed_requests_leaves_no_pages_behind():
    s = ServerProcess(*SERVER_ARGS)
    try:
        figures = soak(s, num_requests=1000, concurrency=24, max_seconds=600)
        assert figures["outcomes"].get("bad_input:rejected", 0) > 100
        assert figures["outcomes"].get("tool_call:ok", 0) > 50
        # Chains yield their pages to new work first, so under this load most sessions lose theirs between turns.
        assert figures["chain_turns_resumed"] > 10
    finally:
        assert s.terminate() == 0
        s.stop()
