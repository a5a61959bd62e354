"""The Milvus vector store (``--store milvus``): the store and its location (:mod:`.store`) on one
collection reached through pymilvus (:mod:`.collection`)."""
