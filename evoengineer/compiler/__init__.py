"""Builds: cached, parallel compilation of candidates through torch.utils.cpp_extension."""
