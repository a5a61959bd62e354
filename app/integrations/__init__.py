"""ragidx inside the RAG frameworks people already use: a retriever and an embeddings class for
LangChain (:mod:`.langchain`, extra ``langchain``) and for LlamaIndex (:mod:`.llama_index`, extra
``llama-index``), and a plugin for simonw's ``llm`` (:mod:`.llm_plugin`, extra ``llm``). Each module
imports its framework; ``import ragidx`` needs none."""
