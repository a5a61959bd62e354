"""The index on disk: SQLite rows and lexical tables (:mod:`.database`, :mod:`.lexical`), read and
written a generation at a time (:mod:`.reader`, :mod:`.writer`; ``check``'s repairs in
:mod:`.repair`), and the vectors in one of the stores behind :mod:`.vector_store`'s interface, each
a sub-package (:mod:`.local` segment files, :mod:`.milvus`; the factory :mod:`.stores`).

Import the modules themselves: this package imports nothing, so reading a filter or a store's
name (the CLI's options) does not load SQLite's and FAISS's machinery."""
