"""Indexing: read sources, chunk them, embed chunks with a strategy, store vectors and rows."""
