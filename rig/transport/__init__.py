"""Layer 4, transport: HTTP to the instances: the two P/D hops (prefill with ``do_remote_decode``,
decode with P's ``kv_transfer_params``), request records, the event loop runner."""
