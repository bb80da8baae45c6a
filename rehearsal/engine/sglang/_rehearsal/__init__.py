"""The rehearsal engine's internals: arguments, rules, GPUs, HTTP server, faults."""
