"""Code the attention families (sdpa, decode) share; not a family of its own."""
