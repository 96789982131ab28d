"""The language models: the interface and loss (``base``), one module per family (``gpt``,
``lstm``, ``hf`` for transformers' families), GPT-2's format both ways (``gpt2``), Hugging Face
files (``files``, the leaf), LoRA (``lora``), embeddings from a file, and ``factory`` on top."""
