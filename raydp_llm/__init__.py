"""raydp_llm: train decoder-only language models on the Spark cluster that holds the data (RayDP +
Ray Train)."""
