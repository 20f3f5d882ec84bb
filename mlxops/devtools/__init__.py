"""Tools for mlxops's own tests and benchmarks: never synced to a node, called by no command."""
