"""Drop-in modules with the call signatures and semantics of other kernel libraries (see README)."""
