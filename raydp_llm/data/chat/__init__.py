"""Conversations (``data.format=chat``): the chat template and its renderer, the stream's stored
tokens, the encode stage, the built-in sample. The preference and prompts rooms build on its
template and encoder."""
