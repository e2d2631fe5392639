"""The Qwen3.5 decoder, its layers and linears, the MTP module, the batch layout, and the checkpoint's config."""
