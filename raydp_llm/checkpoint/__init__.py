"""Checkpoints, one component: ``checkpointer`` chooses the kind (full, or sharded for FSDP and
LoRA) and is the only module that does; ``full``, ``sharded`` and ``model_dir`` write and read each
kind and the model directory (this project's or a Hugging Face one, sealed by ``complete.json``);
``resume`` checks a checkpoint a run starts from; ``layout`` names the files."""
