"""Reproducible studies (scripts, recorded results); not part of the installed package."""
