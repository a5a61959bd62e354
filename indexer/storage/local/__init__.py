"""The default vector store (``--store local``): segment files in the index folder (:mod:`.store`),
each an immutable FAISS structure (:mod:`.faiss_index`) with its deletions (:mod:`.segments`)."""
