"""Generated from tollgate.proto by generate.py."""
