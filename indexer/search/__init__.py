"""Searching an index: dense, lexical and hybrid search, fusion, and snippets."""
